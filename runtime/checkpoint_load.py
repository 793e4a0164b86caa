"""What the engine and `Session.from_checkpoint` read from a checkpoint directory: the config, the
tokenizer, the weights (or random ones for load_format "dummy") and the model built from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsgraph.models.interface import Numerics, default_geometry, numerics_for, ratios
from dsgraph.models.registry import ModelFamily, family_for
from dsgraph.runtime.engine_config import EngineConfig
from dsgraph.runtime.session import CacheSizes, size_caches

__all__ = ["LoadedCheckpoint", "cache_sizes", "checked_max_len", "load_model_dir", "load_weights"]


@dataclass(frozen=True)
class LoadedCheckpoint:
    family: ModelFamily
    cfg: Any
    tokenizer: Any  # tokenizers.Tokenizer
    num: Numerics
    weights: dict[str, torch.Tensor]


def load_model_dir(root: Path, config: EngineConfig) -> LoadedCheckpoint:
    """Config, tokenizer and weights of `root` under `config` (numerics, load)."""
    family = family_for(root)
    cfg = family.load_config(root)
    tokenizer = family.load_tokenizer(root, cfg)
    num = numerics_for(config.numerics)
    checked_max_len(config.max_model_len, cfg.text.max_position_embeddings)
    weights = load_weights(family, root, cfg, config, num, tokenizer)
    return LoadedCheckpoint(family, cfg, tokenizer, num, weights)


def build_target(loaded: LoadedCheckpoint, config: EngineConfig, *, dspark: bool = False) -> Any:
    """The model of `loaded` with the cache geometry of `config` (max_model_len, page_size)."""
    geo = default_geometry(loaded.cfg.text, config.max_model_len, config.cache.page_size)
    return loaded.family.build(loaded.cfg, loaded.tokenizer, loaded.num, geo, dspark)


def load_weights(
    family: ModelFamily, root: Path, cfg: Any, config: EngineConfig, num: Numerics, tokenizer: Any
) -> dict[str, torch.Tensor]:
    """The checkpoint's weights (a progress bar on a terminal), or random ones of the config's shapes
    generated on the platform's device (its name is the torch device type) for load_format "dummy"."""
    if config.load.format == "dummy":
        return family.dummy_weights(cfg, tokenizer, num, config.platform, 0)
    return family.load_weights(root, cfg, tokenizer, num, config.load.check_weights)


def cache_sizes(model: Any, config: EngineConfig) -> CacheSizes:
    """Slots for scheduler.max_num_seqs requests; pages from cache.budget_bytes, or for max_num_seqs
    requests of max_model_len when no budget is given."""
    seqs = config.scheduler.max_num_seqs
    if config.cache.budget_bytes is not None:
        return size_caches(model, seqs, config.cache.budget_bytes)
    return CacheSizes(seqs, {r: model.geo.pages_per_seq(r) * seqs for r in ratios(model.plans)})


def checked_max_len(requested: int, max_positions: int) -> int:
    """max_model_len as configured; above the model's positions it is an error, never a silent cap."""
    if requested > max_positions:
        raise ValueError(
            f"EngineConfig.max_model_len = {requested}: expected at most {max_positions} "
            "(the model's max_position_embeddings)"
        )
    return requested
