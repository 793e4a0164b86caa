"""What the engine and `Session.from_checkpoint` read from a checkpoint directory: the config, the
tokenizer, the weights (or random ones for load_format "dummy") and the model built from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint
from dsgraph.models.deepseek_v41.config import ModelConfig, load_config
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import V41Model, build_model
from dsgraph.models.deepseek_v41.numerics import Numerics, numerics_for
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.models.deepseek_v41.weights import prepare_weights
from dsgraph.runtime.engine_config import EngineConfig
from dsgraph.runtime.session import CacheSizes, size_caches

__all__ = ["LoadedCheckpoint", "cache_sizes", "checked_max_len", "load_model_dir", "load_weights"]


@dataclass(frozen=True)
class LoadedCheckpoint:
    cfg: ModelConfig
    tokenizer: Any  # tokenizers.Tokenizer
    token_map: list[int]
    num: Numerics
    weights: dict[str, torch.Tensor]


def load_model_dir(root: Path, config: EngineConfig) -> LoadedCheckpoint:
    """Config, tokenizer and weights of `root` under `config` (numerics, load_format, check_weights)."""
    cfg = load_config(root)
    tokenizer = load_tokenizer(root, cfg.text.vocab_size)
    token_map, _ = build_token_map(tokenizer)
    num = numerics_for(config.numerics)
    checked_max_len(config.max_model_len, cfg.text.max_position_embeddings)
    weights = load_weights(root, cfg, config, num, token_map)
    return LoadedCheckpoint(cfg, tokenizer, token_map, num, weights)


def build_target(loaded: LoadedCheckpoint, config: EngineConfig, *, dspark: bool = False) -> V41Model:
    """The model of `loaded` with the cache geometry of `config` (max_model_len, page_size)."""
    geo = default_geometry(loaded.cfg.text, config.max_model_len, config.page_size)
    return build_model(loaded.cfg, loaded.token_map, loaded.num, geo, dspark=dspark)


def load_weights(
    root: Path, cfg: ModelConfig, config: EngineConfig, num: Numerics, token_map: list[int]
) -> dict[str, torch.Tensor]:
    """The checkpoint's weights (a progress bar on a terminal), or random ones of the config's shapes
    generated on the platform's device (its name is the torch device type) for load_format "dummy"."""
    if config.load_format == "dummy":
        from dsgraph.runtime.dummy_weights import dummy_weights

        return dummy_weights(cfg, num, token_map, device=config.platform)
    checkpoint = load_checkpoint(root, cfg, progress=True, check_finite=config.check_weights)
    return prepare_weights(cfg, checkpoint, num, token_map)


def cache_sizes(model: V41Model, config: EngineConfig) -> CacheSizes:
    """Slots for max_num_seqs requests; pages from cache_budget_bytes, or for max_num_seqs requests of
    max_model_len when no budget is given."""
    if config.cache_budget_bytes is not None:
        return size_caches(model, config.max_num_seqs, config.cache_budget_bytes)
    per_seq = {r: model.geo.pages_per_seq(r) * config.max_num_seqs for r in ratios(model.plans)}
    return CacheSizes(config.max_num_seqs, per_seq)


def checked_max_len(requested: int, max_positions: int) -> int:
    """max_model_len as configured; above the model's positions it is an error, never a silent cap."""
    if requested > max_positions:
        raise ValueError(
            f"max_model_len: {requested}, expected at most {max_positions} "
            "(the model's max_position_embeddings)"
        )
    return requested
