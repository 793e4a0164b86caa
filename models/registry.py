"""The models dsgraph runs, keyed by config.json's `model_type`: one interface the runtime uses for all.

A `ModelFamily` reads a checkpoint directory's config and tokenizer, builds the traceable model (an object
with `cfg`, `plans`, `geo`, `dspark`, `step_types()`, `cache_types()`, `trace_step(...)`: models/interface.py
`Model`), prepares its weights (loaded, or random from the config alone) and lists its checkpoint tensors.
The runtime imports this module and models/interface.py, never a model package.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "Drafting", "ModelFamily", "family_for", "family_of"]


@dataclass(frozen=True)
class Drafting:
    """How a family drafts: the `speculative` value that selects its draft layers, why a checkpoint
    cannot draft (None when it can), and the tokens one draft pass proposes."""

    method: str
    # (cfg, weights) -> None when the weights hold every draft layer the config declares, else the reason
    # (naming the config field or the tensors)
    missing: Callable[[Any, Mapping[str, Any]], str | None]
    num_tokens: Callable[[Any], int]


@dataclass(frozen=True)
class ModelFamily:
    model_type: str
    load_config: Callable[[Path], Any]
    # (root, cfg) -> the tokenizers.Tokenizer of the checkpoint
    load_tokenizer: Callable[[Path, Any], Any]
    # (cfg, tokenizer, numerics, geometry, dspark[, prefill truncation mode][, token_map=...]) -> the
    # model; `token_map` (V4.1's Engram map) replaces the tokenizer's, for planning without a tokenizer
    build: Callable[..., Any]
    # (root, cfg, tokenizer, numerics, check_finite) -> the step graph's weight inputs
    load_weights: Callable[[Path, Any, Any, Any, bool | None], dict[str, Any]]
    # (cfg, tokenizer, numerics, device, seed) -> random weight inputs of the config's shapes
    dummy_weights: Callable[[Any, Any, Any, str, int], dict[str, Any]]
    # cfg -> every checkpoint tensor (name -> models/interface.py TensorSpec)
    expected_tensors: Callable[[Any], dict[str, Any]]
    # (cfg, stored tensors, numerics, token_map) -> the step graph's weight inputs
    prepare_weights: Callable[[Any, Any, Any, list[int]], dict[str, Any]]
    drafting: Drafting


def _v41_tokenizer(root: Path, cfg: Any) -> Any:
    from dsgraph.models.deepseek_v41.engram_map import load_tokenizer

    return load_tokenizer(root, cfg.text.vocab_size)


def _v41_build(
    cfg: Any,
    tokenizer: Any,
    num: Any,
    geo: Any,
    dspark: bool,
    truncation: str = "off",
    *,
    token_map: list[int] | None = None,
) -> Any:
    from dsgraph.models.deepseek_v41.engram_map import build_token_map
    from dsgraph.models.deepseek_v41.model import build_model

    tmap = build_token_map(tokenizer)[0] if token_map is None else token_map
    return build_model(cfg, tmap, num, geo, dspark=dspark, truncation=truncation)


def _v41_weights(root: Path, cfg: Any, tokenizer: Any, num: Any, check: bool | None) -> dict[str, Any]:
    from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint
    from dsgraph.models.deepseek_v41.engram_map import build_token_map
    from dsgraph.models.deepseek_v41.weights import prepare_weights

    checkpoint = load_checkpoint(root, cfg, progress=True, check_finite=check)
    return prepare_weights(cfg, checkpoint, num, build_token_map(tokenizer)[0])


def _v41_dummy(cfg: Any, tokenizer: Any, num: Any, device: str, seed: int) -> dict[str, Any]:
    from dsgraph.models.deepseek_v41.dummy_weights import dummy_weights
    from dsgraph.models.deepseek_v41.engram_map import build_token_map

    return dummy_weights(cfg, num, build_token_map(tokenizer)[0], device, seed)


def _v41_expected(cfg: Any) -> dict[str, Any]:
    from dsgraph.models.deepseek_v41.checkpoint_spec import expected_tensors

    return expected_tensors(cfg)


def _v41_prepare(cfg: Any, stored: Any, num: Any, token_map: list[int]) -> dict[str, Any]:
    from dsgraph.models.deepseek_v41.weights import prepare_weights

    return prepare_weights(cfg, stored, num, token_map)


def _v41_config(root: Path) -> Any:
    from dsgraph.models.deepseek_v41.config import load_config

    return load_config(root)


def _v4_config(root: Path) -> Any:
    from dsgraph.models.deepseek_v4.config import load_config

    return load_config(root)


def _v4_build(
    cfg: Any,
    _tokenizer: Any,
    num: Any,
    geo: Any,
    dspark: bool,
    truncation: str = "off",
    *,
    token_map: list[int] | None = None,  # V4 has no Engram map
) -> Any:
    from dsgraph.models.deepseek_v4.model import build_model

    if truncation != "off":
        raise ValueError(
            f"prefill_truncation: {truncation!r} is not available for deepseek_v4 checkpoints "
            "(allowed: 'off')"
        )
    return build_model(cfg, num, geo, dspark=dspark)


def _v4_weights(root: Path, cfg: Any, _tokenizer: Any, num: Any, check: bool | None) -> dict[str, Any]:
    from dsgraph.models.deepseek_v4.checkpoint_load import load_weights

    return load_weights(root, cfg, num, check)


def _v4_dummy(cfg: Any, _tokenizer: Any, num: Any, device: str, seed: int) -> dict[str, Any]:
    from dsgraph.models.deepseek_v4.dummy import dummy_weights

    return dummy_weights(cfg, num, device, seed)


def _v4_expected(cfg: Any) -> dict[str, Any]:
    from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors

    return expected_tensors(cfg)


def _v4_prepare(cfg: Any, stored: Any, num: Any, _token_map: list[int]) -> dict[str, Any]:
    from dsgraph.models.deepseek_v4.weights import prepare_weights

    return prepare_weights(cfg, stored, num)


def _v41_missing(cfg: Any, weights: Mapping[str, Any]) -> str | None:
    stages = cfg.text.num_nextn_predict_layers
    if stages == 0:
        return "the config's num_nextn_predict_layers is 0 (no DSpark stages)"
    if all(any(k.startswith(f"mtp.{s}.") for k in weights) for s in range(stages)):
        return None
    held = sorted({k.split(".")[1] for k in weights if k.startswith("mtp.")})
    return (
        f"the checkpoint's DSpark stages mtp.0..{stages - 1} are missing: the config declares {stages} "
        f"(num_nextn_predict_layers) and the weights hold {held}"
    )


def _v4_missing(cfg: Any, weights: Mapping[str, Any]) -> str | None:
    layers = cfg.text.num_nextn_predict_layers
    if layers != 1:
        return f"the config's num_nextn_predict_layers is {layers}, expected 1 (one MTP layer)"
    # the loader reads the layer whole or not at all (models/deepseek_v4/checkpoint_load.py)
    if "mtp.0.eh_proj.weight" in weights:
        return None
    return (
        "the checkpoint has no MTP layer in this project's layout (mtp.0.eh_proj.weight and the rest of "
        "models/deepseek_v4/mtp.py's mtp_tensors); the released V4-Flash MTP tensor names are not mapped yet"
    )


FAMILIES: dict[str, ModelFamily] = {
    "deepseek_v41": ModelFamily(
        "deepseek_v41",
        _v41_config,
        _v41_tokenizer,
        _v41_build,
        _v41_weights,
        _v41_dummy,
        _v41_expected,
        _v41_prepare,
        Drafting("dspark", _v41_missing, lambda cfg: cfg.text.dspark_block_size),
    ),
    "deepseek_v4": ModelFamily(
        "deepseek_v4",
        _v4_config,
        _v41_tokenizer,
        _v4_build,
        _v4_weights,
        _v4_dummy,
        _v4_expected,
        _v4_prepare,
        Drafting("mtp", _v4_missing, lambda _cfg: 1),
    ),
}


def family_of(cfg: Any) -> ModelFamily:
    """The family of a parsed config: V4's carries its `model_type`; V4.1's config has none."""
    return FAMILIES[getattr(cfg, "model_type", "deepseek_v41")]


def family_for(model_dir: str | Path) -> ModelFamily:
    """The family of a checkpoint directory (or config.json path), by its `model_type`."""
    p = Path(model_dir)
    path = p / "config.json" if p.is_dir() else p
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return FAMILIES["deepseek_v41"]  # its loader reports the missing or malformed file
    if model_type not in FAMILIES:
        from dsgraph.models.deepseek_v41.config_rules import ConfigError

        raise ConfigError(f"{path}: model_type", f"{model_type!r} is not one of {sorted(FAMILIES)}")
    return FAMILIES[model_type]
