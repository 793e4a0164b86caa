"""DeepSeek-V4.1 configuration: typed, frozen, validated (spec model-v41 sections 1 and 2).

`parse_config` reads the released nested `config.json` (top level + `text_config` + `vision_config`).
A missing field takes the reference config class's default (config_defaults.py), as NeMo and
transformers do. Every error names the field path, the value found and what was expected. Unknown fields
are kept in `extra` mappings so newer checkpoints still load, with one warning naming them. Pure Python:
no torch here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsgraph.models.deepseek_v41.config_defaults import BASE_KEYS, TOP_DEFAULTS, text_default
from dsgraph.models.deepseek_v41.config_rules import ConfigError, validate_text

__all__ = [
    "ConfigError",
    "ModelConfig",
    "QuantConfig",
    "RopeScaling",
    "TextConfig",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """YaRN parameters applied together with `compress_rope_theta` (spec 3.2)."""

    rope_type: str
    factor: float
    beta_fast: float
    beta_slow: float
    original_max_position_embeddings: int
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class TextConfig:
    """Every `text_config` field of spec 1.1 (including the DSpark fields)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    swiglu_limit: float
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    compress_rope_theta: float
    rope_scaling: RopeScaling
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    scoring_func: str
    topk_method: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    sliding_window: int
    compress_ratios: tuple[int, ...]
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    candidate_source_layer_id: int
    candidate_topk_blocks: int
    candidate_block_size: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    engram_layer_ids: tuple[int, ...]
    engram_num_embeddings: tuple[int, ...]
    engram_max_ngram_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_token_id: int
    engram_compressed_vocab_size: int
    num_nextn_predict_layers: int
    dspark_block_size: int
    dspark_noise_token_id: int
    dspark_target_layer_ids: tuple[int, ...]
    dspark_markov_rank: int
    dspark_n_routed_experts: int
    dspark_num_experts_per_tok: int
    hidden_act: str = "silu"
    attention_bias: bool = False
    dtype: str = "bfloat16"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_layers_total(self) -> int:
        """Backbone layers plus DSpark stages (= len(compress_ratios))."""
        return self.num_hidden_layers + self.num_nextn_predict_layers


@dataclass(frozen=True, slots=True)
class QuantConfig:
    """`quantization_config` of the released checkpoint (FP8 e4m3, UE8M0 scales, FP4 experts)."""

    quant_method: str = "fp8"
    fmt: str = "e4m3"
    scale_fmt: str = "ue8m0"
    weight_block_size: tuple[int, int] = (32, 32)
    expert_dtype: str = "fp4"
    activation_scheme: str = "dynamic"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The whole `config.json`; `quant` is None for an unquantized (all-BF16 weights) checkpoint."""

    text: TextConfig
    quant: QuantConfig | None
    image_token_id: int
    pad_token_id: int
    bos_token_id: int
    eos_token_id: int
    tie_word_embeddings: bool = False
    vision_num_hidden_layers: int = 0
    dtype: str = "bfloat16"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


_TOP_KNOWN = {"model_type", "architectures", "text_config", "vision_config", "quantization_config"}


def parse_config(d: Mapping[str, Any]) -> ModelConfig:
    """Parse and validate a released nested config dict; raise `ConfigError` naming the field."""
    if not isinstance(d, Mapping):
        raise ConfigError("config", f"{type(d).__name__} is not a JSON object")
    if d.get("model_type") != "deepseek_v41":
        raise ConfigError("model_type", f"{d.get('model_type')!r} is not 'deepseek_v41'")
    arch = d.get("architectures", ["DeepseekV41ForCausalLM"])
    if not isinstance(arch, list) or "DeepseekV41ForCausalLM" not in arch:
        raise ConfigError("architectures", f"{arch!r} does not contain 'DeepseekV41ForCausalLM'")
    text_raw = d.get("text_config")
    if not isinstance(text_raw, Mapping):
        raise ConfigError("text_config", f"{text_raw!r} is not a JSON object")
    text = _parse_dataclass(TextConfig, text_raw, "text_config", defaults=lambda n: text_default(n, text_raw))
    validate_text(text)
    quant = _parse_quant(d, text_raw)
    vision = d.get("vision_config", {})
    if not isinstance(vision, Mapping):
        raise ConfigError("vision_config", f"{vision!r} is not a JSON object")
    top = {k: v for k, v in d.items() if k not in _TOP_KNOWN}
    top["vision_num_hidden_layers"] = _convert(
        vision.get("num_hidden_layers", 0), int, "vision_config.num_hidden_layers"
    )
    cfg = _parse_dataclass(ModelConfig, top, "", defaults=TOP_DEFAULTS.__getitem__, text=text, quant=quant)
    _validate_top(cfg)
    _warn_unknown(cfg)
    return cfg


def _warn_unknown(cfg: ModelConfig) -> None:
    """One warning naming every key dsgraph does not know (the base class's own keys excepted)."""
    unknown = [k for k in cfg.extra if k not in BASE_KEYS] + [
        f"text_config.{k}" for k in cfg.text.extra if k not in BASE_KEYS
    ]
    if unknown:
        warnings.warn(f"config.json: unknown keys ignored: {', '.join(unknown)}", UserWarning, stacklevel=3)


def load_config(path: str | Path) -> ModelConfig:
    """Load `config.json` (or a checkpoint directory holding it) and parse it."""
    return load_config_with(path, parse_config)


def load_config_with(path: str | Path, parse: Callable[[Any], Any]) -> Any:
    """`parse` applied to the JSON of `config.json` (or of a directory's), errors naming the file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"config.json not found at {p}")
    try:
        return parse(json.loads(p.read_text()))
    except ConfigError as exc:
        exc.args = (f"{p}: {exc}",)  # keeps the field path, adds the file
        raise
    except ValueError as exc:  # malformed JSON (UnicodeDecodeError included)
        raise ConfigError(str(p), f"not valid JSON: {exc}") from exc


def _parse_quant(d: Mapping[str, Any], text_raw: Mapping[str, Any]) -> QuantConfig | None:
    # HF puts quantization_config at the top level; V4-era exports also nest it in text_config.
    raw, path = d.get("quantization_config"), "quantization_config"
    if raw is None:
        raw, path = text_raw.get("quantization_config"), "text_config.quantization_config"
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"{raw!r} is not a JSON object")
    q = _parse_dataclass(QuantConfig, raw, path)
    for name, allowed in (
        ("quant_method", ("fp8",)),
        ("fmt", ("e4m3",)),
        ("scale_fmt", ("ue8m0",)),
        ("expert_dtype", ("fp4", "fp8")),
        ("activation_scheme", ("dynamic",)),
    ):
        if getattr(q, name) not in allowed:
            raise ConfigError(f"{path}.{name}", f"{getattr(q, name)!r} is not one of {allowed}")
    if len(q.weight_block_size) != 2 or min(q.weight_block_size) <= 0:
        raise ConfigError(
            f"{path}.weight_block_size", f"{list(q.weight_block_size)} is not two positive ints"
        )
    return q


def _validate_top(cfg: ModelConfig) -> None:
    vocab = cfg.text.vocab_size
    for name in ("image_token_id", "pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(cfg, name)
        if not 0 <= value < vocab:
            raise ConfigError(name, f"{value} is outside the vocabulary [0, {vocab})")
    if cfg.tie_word_embeddings:
        raise ConfigError("tie_word_embeddings", "true; V4.1 has a separate head.weight (expected false)")
    if cfg.vision_num_hidden_layers < 0:
        raise ConfigError("vision_config.num_hidden_layers", f"{cfg.vision_num_hidden_layers} is negative")


def _parse_dataclass(
    cls: type, raw: Mapping[str, Any], path: str, defaults: Callable[[str], Any] | None = None, **given: Any
) -> Any:
    """Build `cls` from `raw` by its type hints; unknown keys go to `extra`. A missing field takes
    `defaults(name)` (checked like a given value), else the dataclass default, else is an error."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = dict(given)
    names = {f.name for f in dataclasses.fields(cls)}
    for f in dataclasses.fields(cls):
        if f.name == "extra" or f.name in given:
            continue
        where = f"{path}.{f.name}" if path else f.name
        if f.name in raw:
            kwargs[f.name] = _convert(raw[f.name], hints[f.name], where)
        elif defaults is not None:
            kwargs[f.name] = _convert(defaults(f.name), hints[f.name], where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(where, f"missing (expected {_type_name(hints[f.name])})")
    kwargs["extra"] = {k: v for k, v in raw.items() if k not in names}
    return cls(**kwargs)


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is int:
        if type(value) is not int:
            raise ConfigError(where, f"{value!r} is not an integer")
        return value
    if hint is float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ConfigError(where, f"{value!r} is not a finite number")
        return float(value)
    if hint in (str, bool):
        if type(value) is not hint:
            raise ConfigError(where, f"{value!r} is not a {hint.__name__}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(where, f"{value!r} is not a list")
        item = typing.get_args(hint)[0]
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is RopeScaling:
        if not isinstance(value, Mapping):
            raise ConfigError(where, f"{value!r} is not a JSON object")
        return _parse_dataclass(RopeScaling, value, where)
    raise TypeError(f"{where}: no converter for type {hint!r}")


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is tuple:
        return f"a list of {typing.get_args(hint)[0].__name__}"
    return getattr(hint, "__name__", str(hint))
