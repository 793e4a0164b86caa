"""Validation rules of the V4 config: each raises `ConfigError` naming the field, the value and the rule."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsgraph.models.deepseek_v41.config_rules import ConfigError

if TYPE_CHECKING:
    from dsgraph.models.deepseek_v4.config import V4TextConfig

__all__ = ["validate_text"]

_POSITIVE = (
    "vocab_size", "hidden_size", "moe_intermediate_size", "num_attention_heads", "head_dim",
    "qk_rope_head_dim", "q_lora_rank", "num_experts_per_tok", "n_routed_experts", "max_position_embeddings",
    "hc_mult", "hc_sinkhorn_iters", "sliding_window", "o_groups", "o_lora_rank", "index_n_heads",
    "index_head_dim", "index_topk",
)  # fmt: skip


def validate_text(t: V4TextConfig) -> None:
    for name in _POSITIVE:
        if getattr(t, name) <= 0:
            raise ConfigError(name, f"{getattr(t, name)} is not positive")
    for name in ("rms_norm_eps", "hc_eps", "swiglu_limit", "routed_scaling_factor", "rope_theta"):
        if getattr(t, name) <= 0:
            raise ConfigError(name, f"{getattr(t, name)} is not positive")
    _check_fixed(t)
    _check_dims(t)
    if t.csa_ratio < 2 or t.hca_ratio < 2 or t.csa_ratio == t.hca_ratio:
        raise ConfigError(
            "compress_rates", f"CSA {t.csa_ratio} and HCA {t.hca_ratio}: expected two different ratios >= 2"
        )
    allowed = [0, t.csa_ratio, t.hca_ratio]
    for i, r in enumerate(t.compress_ratios):
        if r not in allowed:
            raise ConfigError(f"compress_ratios[{i}]", f"{r} is not one of {allowed}")
    if not 0 <= t.num_hash_layers <= t.num_hidden_layers:
        raise ConfigError("num_hash_layers", f"{t.num_hash_layers} is outside [0, {t.num_hidden_layers}]")
    if t.num_experts_per_tok > t.n_routed_experts:
        raise ConfigError(
            "num_experts_per_tok", f"{t.num_experts_per_tok} exceeds n_routed_experts {t.n_routed_experts}"
        )
    if t.num_nextn_predict_layers < 0:
        raise ConfigError("num_nextn_predict_layers", f"{t.num_nextn_predict_layers} is negative")


def _check_fixed(t: V4TextConfig) -> None:
    """Values the architecture fixes (what transformers' implementation computes)."""
    for name, allowed in (
        ("num_key_value_heads", (1,)),
        ("n_shared_experts", (1,)),
        ("scoring_func", ("sqrtsoftplus",)),
        ("norm_topk_prob", (True,)),
        ("hidden_act", ("silu",)),
    ):
        if getattr(t, name) not in allowed:
            raise ConfigError(name, f"{getattr(t, name)!r} is not one of {list(allowed)}")


def _check_dims(t: V4TextConfig) -> None:
    if t.qk_rope_head_dim % 2 or t.qk_rope_head_dim > t.head_dim:
        raise ConfigError(
            "qk_rope_head_dim", f"{t.qk_rope_head_dim} is not even and <= head_dim {t.head_dim}"
        )
    if t.index_head_dim < t.qk_rope_head_dim:
        raise ConfigError(
            "index_head_dim", f"{t.index_head_dim} is below qk_rope_head_dim {t.qk_rope_head_dim} (rotated)"
        )
    if (t.num_attention_heads * t.head_dim) % t.o_groups:
        raise ConfigError(
            "o_groups", f"{t.o_groups} does not divide num_attention_heads * head_dim "
            f"{t.num_attention_heads * t.head_dim}",
        )  # fmt: skip
    if t.num_attention_heads % t.o_groups:
        raise ConfigError(
            "o_groups", f"{t.o_groups} does not divide num_attention_heads {t.num_attention_heads}"
        )
