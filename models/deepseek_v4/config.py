"""DeepSeek-V4 configuration: typed, frozen, validated; errors name the field, the value and the rule.

`parse_config` reads a flat V4 `config.json` (released or `save_pretrained` form). transformers' names and
its legacy names are both accepted: the attention schedule as `layer_types` (+ `compress_rates`) or
per-layer `compress_ratios` (0, 4 or 128), the hash-routed prefix as `mlp_layer_types` or
`num_hash_layers`, the rotary width as `qk_rope_head_dim` or `partial_rotary_factor`, YaRN as
`rope_scaling` or `rope_parameters.compress`. A missing field takes transformers' default
(config_defaults.py). Pure Python: no torch here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsgraph.models.deepseek_v4.config_defaults import DEFAULTS, KNOWN_RATIOS, default_ratios
from dsgraph.models.deepseek_v41.config import (
    QuantConfig,
    RopeScaling,
    _parse_dataclass,
    _parse_quant,
    load_config_with,
)
from dsgraph.models.deepseek_v41.config_rules import ConfigError

__all__ = ["ConfigError", "V4Config", "V4TextConfig", "load_config", "parse_config"]

MODEL_TYPE = "deepseek_v4"
ARCHITECTURE = "DeepseekV4ForCausalLM"


@dataclass(frozen=True, slots=True)
class V4TextConfig:
    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    num_experts_per_tok: int
    n_routed_experts: int
    n_shared_experts: int
    scoring_func: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    max_position_embeddings: int
    rope_theta: float
    compress_rope_theta: float
    compress_ratios: tuple[int, ...]  # per backbone layer: 0 (sliding window), csa_ratio or hca_ratio
    csa_ratio: int  # compressed sparse attention (overlapping windows, an indexer): 4 in the release
    hca_ratio: int  # heavily compressed attention (every entry attended): 128 in the release
    num_hash_layers: int  # the first layers route by a token -> experts table
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    swiglu_limit: float
    sliding_window: int
    o_groups: int
    o_lora_rank: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    num_nextn_predict_layers: int
    hidden_act: str
    rms_norm_eps: float
    dtype: str
    rope_scaling: RopeScaling | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # The runtime's step layout carries Engram lookback ids; V4 has no Engram and ignores them.
    engram_max_ngram_size: int = 2


@dataclass(frozen=True, slots=True)
class V4Config:
    text: V4TextConfig
    quant: QuantConfig | None
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    tie_word_embeddings: bool = False
    model_type: str = MODEL_TYPE


_SCHEDULE_KEYS = {
    "layer_types",
    "compress_rates",
    "compress_ratios",
    "mlp_layer_types",
    "partial_rotary_factor",
}
_ROPE_KEYS = {"rope_scaling", "rope_parameters"}
_TOP_KEYS = {"model_type", "architectures", "quantization_config", "bos_token_id", "eos_token_id"}
_TOP_KEYS |= {"pad_token_id", "tie_word_embeddings", "expert_dtype"}
# keys transformers' PreTrainedConfig writes that dsgraph does not use (accepted silently)
_BASE_KEYS = {"transformers_version", "torch_dtype", "initializer_range", "use_cache", "attention_bias"}
_BASE_KEYS |= {"attention_dropout", "mlp_bias", "output_router_logits", "router_aux_loss_coef"}
_BASE_KEYS |= {"router_jitter_noise", "topk_method", "auto_map", "name_or_path", "_name_or_path"}


def parse_config(d: Mapping[str, Any]) -> V4Config:
    """Parse and validate a V4 config dict; raise `ConfigError` naming the field."""
    if not isinstance(d, Mapping):
        raise ConfigError("config", f"{type(d).__name__} is not a JSON object")
    if d.get("model_type") != MODEL_TYPE:
        raise ConfigError("model_type", f"{d.get('model_type')!r} is not {MODEL_TYPE!r}")
    arch = d.get("architectures", [ARCHITECTURE])
    if not isinstance(arch, list) or ARCHITECTURE not in arch:
        raise ConfigError("architectures", f"{arch!r} does not contain {ARCHITECTURE!r}")
    raw = {k: v for k, v in d.items() if k not in _TOP_KEYS | _SCHEDULE_KEYS | _ROPE_KEYS}
    n = raw.get("num_hidden_layers", DEFAULTS["num_hidden_layers"])
    if type(n) is not int or n < 1:
        raise ConfigError("num_hidden_layers", f"{n!r} is not a positive integer")
    raw["compress_ratios"] = _ratios(d, n)
    rates = {**KNOWN_RATIOS, **(d.get("compress_rates") or {})}
    raw["csa_ratio"] = rates["compressed_sparse_attention"]
    raw["hca_ratio"] = rates["heavily_compressed_attention"]
    raw["num_hash_layers"] = _hash_layers(d, n)
    raw["qk_rope_head_dim"] = _rope_dim(d)
    raw.pop("engram_max_ngram_size", None)
    yarn = _yarn(d)
    rope = None if yarn is None else _parse_dataclass(RopeScaling, yarn, "rope_scaling")
    text = _parse_dataclass(V4TextConfig, raw, "", defaults=_default, rope_scaling=rope)
    _warn_unknown(text)
    validate_text(text)
    return _top(d, text)


def _default(name: str) -> Any:
    if name == "engram_max_ngram_size":
        return 2
    return DEFAULTS[name]


def _ratios(d: Mapping[str, Any], n: int) -> list[int]:
    """Per-layer compression ratios from `layer_types` (+ `compress_rates`) or `compress_ratios`."""
    rates = dict(KNOWN_RATIOS)
    given = d.get("compress_rates")
    if given is not None:
        if not isinstance(given, Mapping):
            raise ConfigError("compress_rates", f"{given!r} is not a JSON object")
        rates.update(given)
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) < n:
            raise ConfigError("layer_types", f"{types!r} is not a list of at least {n} layer types")
        for i, kind in enumerate(types[:n]):
            if kind not in rates:
                raise ConfigError(f"layer_types[{i}]", f"{kind!r} is not one of {sorted(KNOWN_RATIOS)}")
        return [rates[k] for k in types[:n]]
    ratios = d.get("compress_ratios")
    if ratios is None:
        return default_ratios(n)
    if not isinstance(ratios, list) or len(ratios) < n:
        raise ConfigError("compress_ratios", f"{ratios!r} is not a list of at least {n} ratios")
    return ratios[:n]  # a released list also covers the MTP layers after the backbone


def _hash_layers(d: Mapping[str, Any], n: int) -> Any:
    types = d.get("mlp_layer_types")
    if types is None:
        return d.get("num_hash_layers", DEFAULTS["num_hash_layers"]) if n >= 0 else 0
    if not isinstance(types, list) or len(types) < n:
        raise ConfigError("mlp_layer_types", f"{types!r} is not a list of at least {n} MoE types")
    count = 0
    while count < n and types[count] == "hash_moe":
        count += 1
    for i, kind in enumerate(types[count:n], start=count):
        if kind != "moe":
            raise ConfigError(
                f"mlp_layer_types[{i}]", f"{kind!r}: expected 'moe' (hash_moe layers come first, then moe)"
            )
    return count


def _rope_dim(d: Mapping[str, Any]) -> Any:
    if "qk_rope_head_dim" in d:
        return d["qk_rope_head_dim"]
    factor = d.get("partial_rotary_factor")
    if factor is None:
        return DEFAULTS["qk_rope_head_dim"]
    head_dim = d.get("head_dim", DEFAULTS["head_dim"])
    if type(factor) not in (int, float) or type(head_dim) is not int:
        raise ConfigError("partial_rotary_factor", f"{factor!r} is not a number")
    return int(head_dim * factor)


def _yarn(d: Mapping[str, Any]) -> Any:
    """The compressed layers' YaRN parameters, or None for plain RoPE (transformers' default)."""
    params = d.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("compress"), Mapping):
        scaling = dict(params["compress"])
    else:
        scaling = d.get("rope_scaling") if d.get("rope_scaling") is not None else params
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ConfigError("rope_scaling", f"{scaling!r} is not a JSON object")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "yarn":
        raise ConfigError("rope_scaling.rope_type", f"{kind!r} is not one of ['default', 'yarn']")
    keep = ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings")
    missing = [k for k in keep if k not in scaling]
    if missing:
        raise ConfigError(f"rope_scaling.{missing[0]}", "missing (YaRN needs factor, betas, original length)")
    return {"rope_type": "yarn", **{k: scaling[k] for k in keep}}


def _top(d: Mapping[str, Any], text: V4TextConfig) -> V4Config:
    ids = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = d.get(name, DEFAULTS[name])
        if name == "eos_token_id" and isinstance(value, list) and value:
            value = value[0]  # the first end-of-sequence id; the others stop through the tokenizer
        if name == "pad_token_id" and value is None:
            value = ids["eos_token_id"]
        if type(value) is not int or not 0 <= value < text.vocab_size:
            raise ConfigError(name, f"{value!r} is not a token id in [0, {text.vocab_size})")
        ids[name] = value
    tie = d.get("tie_word_embeddings", False)
    if tie is not False:
        raise ConfigError("tie_word_embeddings", f"{tie!r}; V4 has a separate head.weight (expected false)")
    quant_raw = d.get("quantization_config")
    if isinstance(quant_raw, Mapping) and "expert_dtype" in d and "expert_dtype" not in quant_raw:
        d = {**d, "quantization_config": {**quant_raw, "expert_dtype": d["expert_dtype"]}}
    quant = _parse_quant(d, {})
    if quant is not None and quant.weight_block_size[0] % 32 + quant.weight_block_size[1] % 32:
        raise ConfigError(
            "quantization_config.weight_block_size",
            f"{list(quant.weight_block_size)} is not a multiple of 32 in both dims",
        )
    return V4Config(text, quant, ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"])


def _warn_unknown(text: V4TextConfig) -> None:
    unknown = [k for k in text.extra if k not in _BASE_KEYS]
    if unknown:
        warnings.warn(f"config.json: unknown keys ignored: {', '.join(unknown)}", UserWarning, stacklevel=3)


def load_config(path: str | Path) -> V4Config:
    """Load `config.json` (or a checkpoint directory holding it) and parse it."""
    return load_config_with(path, parse_config)


from dsgraph.models.deepseek_v4.config_rules import validate_text  # noqa: E402  (imports V4TextConfig)
