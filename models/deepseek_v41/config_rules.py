"""Validation rules of the V4.1 text config (spec model-v41 sections 1.1, 2, 3.3, 6, 8).

Each rule raises `ConfigError` with the field path, the value found and what was expected. The
Engram prime-sum check lives with the Engram hashing code, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsgraph.models.deepseek_v41.config import TextConfig

__all__ = ["ConfigError", "validate_text"]

# Groups of the on-disk and cache formats: FP8/MXFP4 scale groups and FP4 expert rows are 32 wide.
_GROUP = 32
_RATIOS = (0, 1, 2)


class ConfigError(ValueError):
    """A config value is missing, mistyped or violates a model rule; `path` is the field path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def validate_text(t: TextConfig) -> None:
    """Check every rule; the first violation raises `ConfigError`."""
    _check_values(t)
    _check_dims(t)
    _check_ratios(t)
    for name in (
        "kv_source_layer_ids",
        "index_source_layer_ids",
        "engram_layer_ids",
        "dspark_target_layer_ids",
    ):
        _check_layer_list(t, name)
    _check_sources(t)
    _check_candidates(t)
    _check_engram(t)
    _check_dspark(t)


def _err(name: str, message: str) -> ConfigError:
    return ConfigError(f"text_config.{name}", message)


def _check_values(t: TextConfig) -> None:
    positive_ints = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "head_dim",
        "qk_rope_head_dim",
        "q_lora_rank",
        "o_groups",
        "o_lora_rank",
        "max_position_embeddings",
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "sliding_window",
        "index_n_heads",
        "index_head_dim",
        "index_topk",
        "hc_mult",
        "hc_sinkhorn_iters",
    )
    for name in positive_ints:
        if getattr(t, name) <= 0:
            raise _err(name, f"{getattr(t, name)} is not a positive integer")
    positive_floats = (
        "swiglu_limit",
        "rms_norm_eps",
        "rope_theta",
        "compress_rope_theta",
        "routed_scaling_factor",
        "hc_eps",
    )
    for name in positive_floats:
        if getattr(t, name) <= 0:
            raise _err(name, f"{getattr(t, name)} is not > 0")
    exact = (("num_key_value_heads", 1), ("n_shared_experts", 1), ("attention_bias", False))
    for name, want in exact:
        if getattr(t, name) != want:
            raise _err(name, f"{getattr(t, name)!r} is not {want!r} (the only value V4.1 defines)")
    choices = (("hidden_act", ("silu",)), ("scoring_func", ("sqrtsoftplus",)), ("topk_method", ("noaux_tc",)))
    for name, allowed in choices:
        if getattr(t, name) not in allowed:
            raise _err(name, f"{getattr(t, name)!r} is not one of {allowed}")
    if t.num_nextn_predict_layers < 0:
        raise _err("num_nextn_predict_layers", f"{t.num_nextn_predict_layers} is negative")
    _check_rope_scaling(t)


def _check_rope_scaling(t: TextConfig) -> None:
    rs = t.rope_scaling
    if rs.rope_type != "yarn":
        raise _err("rope_scaling.rope_type", f"{rs.rope_type!r} is not one of ('yarn',)")
    for name in ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings"):
        if getattr(rs, name) <= 0:
            raise _err(f"rope_scaling.{name}", f"{getattr(rs, name)} is not > 0")


def _check_dims(t: TextConfig) -> None:
    for name in (
        "hidden_size",
        "head_dim",
        "index_head_dim",
        "moe_intermediate_size",
        "q_lora_rank",
        "o_lora_rank",
    ):
        if getattr(t, name) % _GROUP:
            raise _err(name, f"{getattr(t, name)} is not a multiple of {_GROUP} (quantization group width)")
    rope = t.qk_rope_head_dim
    if rope % 2:
        raise _err("qk_rope_head_dim", f"{rope} is not even (RoPE rotates channel pairs)")
    if rope > min(t.head_dim, t.index_head_dim):
        raise _err(
            "qk_rope_head_dim", f"{rope} exceeds head_dim {t.head_dim} or index_head_dim {t.index_head_dim}"
        )
    if t.num_attention_heads % t.o_groups:
        raise _err("o_groups", f"{t.o_groups} does not divide num_attention_heads {t.num_attention_heads}")
    if t.num_experts_per_tok > t.n_routed_experts:
        raise _err(
            "num_experts_per_tok", f"{t.num_experts_per_tok} exceeds n_routed_experts {t.n_routed_experts}"
        )


def _check_ratios(t: TextConfig) -> None:
    ratios = t.compress_ratios
    want = t.num_hidden_layers + t.num_nextn_predict_layers
    if len(ratios) != want:
        raise _err(
            "compress_ratios",
            f"{len(ratios)} entries, expected {want} (num_hidden_layers "
            f"{t.num_hidden_layers} + num_nextn_predict_layers {t.num_nextn_predict_layers})",
        )
    for i, r in enumerate(ratios):
        if r not in _RATIOS:
            raise _err(f"compress_ratios[{i}]", f"{r} is not one of {_RATIOS}")
        if i >= t.num_hidden_layers and r != 0:
            raise _err(
                f"compress_ratios[{i}]",
                f"{r} on DSpark stage {i - t.num_hidden_layers}, expected 0 (draft stages are SWA-only)",
            )


def _check_layer_list(t: TextConfig, name: str) -> None:
    ids = getattr(t, name)
    for k, layer in enumerate(ids):
        if not 0 <= layer < t.num_hidden_layers:
            raise _err(
                f"{name}[{k}]", f"{layer} is not a backbone layer (expected 0..{t.num_hidden_layers - 1})"
            )
        if k and layer <= ids[k - 1]:
            raise _err(
                f"{name}[{k}]", f"{layer} does not follow {ids[k - 1]} (expected strictly increasing ids)"
            )


def _check_sources(t: TextConfig) -> None:
    for k, layer in enumerate(t.kv_source_layer_ids):
        if layer not in t.index_source_layer_ids:
            raise _err(
                f"kv_source_layer_ids[{k}]",
                f"KV source {layer} is not in index_source_layer_ids "
                f"{list(t.index_source_layer_ids)} (every KV source must be an index source)",
            )
    for name in ("kv_source_layer_ids", "index_source_layer_ids"):
        for k, layer in enumerate(getattr(t, name)):
            if t.compress_ratios[layer] == 0:
                raise _err(
                    f"{name}[{k}]", f"layer {layer} has compress ratio 0; SWA-only layers cannot be sources"
                )
    owner = -1
    for i in range(t.num_hidden_layers):
        r = t.compress_ratios[i]
        if i in t.kv_source_layer_ids:
            owner = i
        if r and (owner < 0 or t.compress_ratios[owner] != r):
            found = f"layer {owner} with ratio {t.compress_ratios[owner]}" if owner >= 0 else "none"
            raise _err(
                f"compress_ratios[{i}]",
                f"layer {i} has ratio {r} but the latest preceding KV source is "
                f"{found} (expected a preceding KV source of ratio {r})",
            )


def _check_candidates(t: TextConfig) -> None:
    c = t.candidate_source_layer_id
    if c == -1:
        return
    if c not in t.kv_source_layer_ids:
        raise _err("candidate_source_layer_id", f"{c} is not -1 or a KV source {list(t.kv_source_layer_ids)}")
    for name in ("candidate_topk_blocks", "candidate_block_size"):
        if getattr(t, name) <= 0:
            raise _err(name, f"{getattr(t, name)} is not a positive integer (candidates are enabled)")
    later = [layer for layer in t.kv_source_layer_ids if layer > c]
    if later:
        # Index layers after the candidate source restrict to its blocks, so they must read its entries.
        raise _err(
            "kv_source_layer_ids",
            f"KV source {later[0]} follows candidate_source_layer_id {c} "
            "(expected no KV source after the candidate source)",
        )


def _check_engram(t: TextConfig) -> None:
    if len(t.engram_num_embeddings) != len(t.engram_layer_ids):
        raise _err(
            "engram_num_embeddings",
            f"{len(t.engram_num_embeddings)} entries, expected one per "
            f"engram_layer_ids entry ({len(t.engram_layer_ids)})",
        )
    for k, rows in enumerate(t.engram_num_embeddings):
        if rows <= 0:
            raise _err(f"engram_num_embeddings[{k}]", f"{rows} is not a positive integer")
    if not t.engram_layer_ids:
        return
    for name in ("engram_n_heads", "engram_head_dim", "engram_vocab_size", "engram_compressed_vocab_size"):
        if getattr(t, name) <= 0:
            raise _err(name, f"{getattr(t, name)} is not a positive integer")
    if t.engram_head_dim % _GROUP:
        raise _err(
            "engram_head_dim", f"{t.engram_head_dim} is not a multiple of {_GROUP} (FP8 row scale groups)"
        )
    if t.engram_max_ngram_size < 2:
        raise _err("engram_max_ngram_size", f"{t.engram_max_ngram_size} is below 2")
    if not 0 <= t.engram_pad_token_id < t.vocab_size:
        raise _err(
            "engram_pad_token_id", f"{t.engram_pad_token_id} is outside the vocabulary [0, {t.vocab_size})"
        )


def _check_dspark(t: TextConfig) -> None:
    if t.num_nextn_predict_layers == 0:
        return
    if not t.dspark_target_layer_ids:
        raise _err("dspark_target_layer_ids", "empty, expected the target layers whose inputs feed the draft")
    for name in (
        "dspark_block_size",
        "dspark_markov_rank",
        "dspark_n_routed_experts",
        "dspark_num_experts_per_tok",
    ):
        if getattr(t, name) <= 0:
            raise _err(name, f"{getattr(t, name)} is not a positive integer")
    if t.dspark_num_experts_per_tok > t.dspark_n_routed_experts:
        raise _err(
            "dspark_num_experts_per_tok",
            f"{t.dspark_num_experts_per_tok} exceeds dspark_n_routed_experts {t.dspark_n_routed_experts}",
        )
    if not 0 <= t.dspark_noise_token_id < t.vocab_size:
        raise _err(
            "dspark_noise_token_id",
            f"{t.dspark_noise_token_id} is outside the vocabulary [0, {t.vocab_size})",
        )
