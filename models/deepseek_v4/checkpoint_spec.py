"""The tensors of a released V4-Flash checkpoint: name -> shape, dtype, kind.

Names are the release's (what transformers' `deepseek_v4` conversion mapping renames from). Dense
projections are F8_E4M3 with F8_E8M0 block scales (`quantization_config.weight_block_size`, 128 x 128 in
the release), routed experts packed E2M1 (I8) with per-32-column F8_E8M0 scales (`expert_dtype` fp4) or
FP8 blocks (fp8); the compressor and indexer projections, `weights_proj`, the router and the norms are
BF16 or F32 (the release mixes them); mHC, sinks, `ape` and router biases F32; `tid2eid` integer. The MTP
layer (`mtp.*`) is not read here: `mtp.mtp_tensors` lists the tensors of this project's MTP layer, whose
names are not checked against the release, and drafting for V4 is not implemented.
"""

from __future__ import annotations

from dsgraph.models.deepseek_v4.config import V4Config, V4TextConfig
from dsgraph.models.deepseek_v4.layers import Attn, LayerPlan, layer_plans
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, TensorSpec, _Builder, experts

__all__ = ["expected_tensors", "is_skipped"]

_FLOAT = ("BF16", "F16")


def is_skipped(name: str) -> bool:
    """Tensors the loader does not read: the MTP draft layers."""
    return name.startswith("mtp.")


def expected_tensors(cfg: V4Config) -> dict[str, TensorSpec]:
    t = cfg.text
    b = _Builder(cfg)  # type: ignore[arg-type]  (reads only cfg.quant)
    b.plain("embed.weight", (t.vocab_size, t.hidden_size), "BF16", also=("F32",))
    for plan in layer_plans(t):
        _layer(b, t, plan)
    b.plain("norm.weight", (t.hidden_size,), "BF16", also=("F32",))
    b.plain("head.weight", (t.vocab_size, t.hidden_size), "BF16", also=("F32",))
    n = t.hc_mult
    b.plain("hc_head_fn", (n, n * t.hidden_size), "F32")
    b.plain("hc_head_base", (n,), "F32")
    b.plain("hc_head_scale", (1,), "F32")
    return b.out


def _norm(b: _Builder, name: str, width: int) -> None:
    b.plain(name, (width,), "BF16", also=("F32",))


def _layer(b: _Builder, t: V4TextConfig, plan: LayerPlan) -> None:
    p = f"layers.{plan.index}."
    _norm(b, p + "attn_norm.weight", t.hidden_size)
    _attention(b, t, p)
    if plan.attn is not Attn.SWA:
        _compressor(b, t, p + "attn.compressor.", t.head_dim, plan)
    if plan.attn is Attn.CSA:
        b.matrix(
            p + "attn.indexer.wq_b.weight",
            t.index_n_heads * t.index_head_dim,
            t.q_lora_rank,
            TensorKind.FP8_BLOCK,
        )
        b.plain(
            p + "attn.indexer.weights_proj.weight", (t.index_n_heads, t.hidden_size), "BF16", also=("F32",)
        )
        _compressor(b, t, p + "attn.indexer.compressor.", t.index_head_dim, plan)
    _norm(b, p + "ffn_norm.weight", t.hidden_size)
    _ffn(b, t, p, plan)
    mixes = (2 + t.hc_mult) * t.hc_mult
    for site in ("attn", "ffn"):
        b.plain(f"{p}hc_{site}_fn", (mixes, t.hc_mult * t.hidden_size), "F32")
        b.plain(f"{p}hc_{site}_base", (mixes,), "F32")
        b.plain(f"{p}hc_{site}_scale", (3,), "F32")


def _attention(b: _Builder, t: V4TextConfig, p: str) -> None:
    h, hd, heads, groups = t.hidden_size, t.head_dim, t.num_attention_heads, t.o_groups
    b.matrix(p + "attn.wq_a.weight", t.q_lora_rank, h, TensorKind.FP8_BLOCK)
    _norm(b, p + "attn.q_norm.weight", t.q_lora_rank)
    b.matrix(p + "attn.wq_b.weight", heads * hd, t.q_lora_rank, TensorKind.FP8_BLOCK)
    b.matrix(p + "attn.wkv.weight", hd, h, TensorKind.FP8_BLOCK)
    _norm(b, p + "attn.kv_norm.weight", hd)
    b.matrix(p + "attn.wo_a.weight", groups * t.o_lora_rank, heads * hd // groups, TensorKind.FP8_BLOCK)
    b.matrix(p + "attn.wo_b.weight", h, groups * t.o_lora_rank, TensorKind.FP8_BLOCK)
    b.plain(p + "attn.attn_sink", (heads,), "F32")


def _compressor(b: _Builder, t: V4TextConfig, p: str, width: int, plan: LayerPlan) -> None:
    w = 2 * width if plan.overlap else width  # overlapping windows: two projection series
    b.plain(p + "wkv.weight", (w, t.hidden_size), "BF16", also=("F32",))
    b.plain(p + "wgate.weight", (w, t.hidden_size), "BF16", also=("F32",))
    b.plain(p + "ape", (plan.ratio, w), "F32")
    _norm(b, p + "norm.weight", width)


def _ffn(b: _Builder, t: V4TextConfig, p: str, plan: LayerPlan) -> None:
    h, inter, e = t.hidden_size, t.moe_intermediate_size, t.n_routed_experts
    b.plain(p + "ffn.gate.weight", (e, h), "BF16", also=("F32",))
    if plan.is_hash:
        b.plain(p + "ffn.gate.tid2eid", (t.vocab_size, t.num_experts_per_tok), "I64", also=("I32",))
    else:
        b.plain(p + "ffn.gate.bias", (e,), "F32")
    experts(b, h, inter, p, e)
