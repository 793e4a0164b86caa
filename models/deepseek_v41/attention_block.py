"""Attention of one layer in its mode (SWA, Full, Reindex, Reuse), spec 4.5, over the step's caches.

Comments "serving: ..." name a rounding point of `serving` numerics, with its section of
spec/numerics-nemo-vs-deepinfer.md; in `reference` numerics (act_dtype f32, no act_quant) they are no-ops.
"""

from __future__ import annotations

from collections.abc import Mapping

from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.layers_plan import LayerMode, LayerPlan
from dsgraph.ops import op

NEG_INF = float("-inf")


def _step_args(f: Forward) -> tuple[Tracer, Tracer, Tracer, Tracer]:
    s = f.step
    return s["positions"], s["seq_ids"], s["seq_slot"], s["seq_start"]


def _swa_kv(f: Forward, plan: LayerPlan, u: Tracer) -> Tracer:
    """The layer's K(=V) of this step: FP8-rounded rope(kv_norm(wkv u)), written to the layer's ring."""
    p = f"layers.{plan.index}.attn."
    # serving: wkv output, kv_norm output and RoPE output in BF16, FP8 amax over BF16 (1a, 1b, 2a)
    kv = f.norm(f.linear(u, p + "wkv.weight"), p + "kv_norm.weight")
    kv = f.rope(kv, f.step["positions"], plan.rope_theta, plan.use_yarn)
    f.record(f"kv_pre.{plan.index}", kv)
    kv = op.act_qdq(kv, fmt="fp8_g32")
    entries = op.cache_encode(kv, fmt="fp8_g32")
    s = f.step
    name = f"swa.{plan.index}"
    f.new_caches[name] = op.swa_write(
        f.caches[name], entries, s["positions"], s["seq_ids"], s["seq_slot"], s["seq_end"]
    )
    return kv


def _compress(f: Forward, plan: LayerPlan, u: Tracer) -> None:
    """A KV source: pool closed groups into latents; write compressed entries and index keys."""
    p, _t = f"layers.{plan.index}.attn.", f.text
    positions, seq_ids, seq_slot, seq_start = _step_args(f)
    wkv = f.w(p + "compressor.wkv.weight")
    # the projections read u as f32 (exact from BF16); serving: the pooled latent (ratio 2) or the wkv
    # GEMM output (ratio 1) rounded to BF16 before the norm (3a), by compress itself
    step = (positions, seq_ids, seq_slot, seq_start)
    if plan.ratio == 2:
        state = f.caches[f"comp.{plan.index}"]
        wgate = f.w(p + "compressor.wgate.weight")
        latent, closes, new_state = op.compress(
            u, wkv, wgate, state, *step, ratio=2, out_dtype=f.num.act_dtype
        )
        f.new_caches[f"comp.{plan.index}"] = new_state
    else:
        latent, closes = op.compress(u, wkv, *step, ratio=plan.ratio, out_dtype=f.num.act_dtype)
    latent = f.norm(latent, p + "compressor.norm.weight")  # serving: BF16 norm output (1a, 3a)
    entry_ids = positions if plan.ratio == 1 else positions // plan.ratio
    entry_pos = positions if plan.ratio == 1 else entry_ids * plan.ratio
    ckv = f.rope(latent, entry_pos, plan.rope_theta, plan.use_yarn)  # serving: BF16 before NVFP4 (1b, 2c)
    # serving: BF16-weight wk GEMM with BF16 output, no FP8 input (2d "not quantized"), BF16 k_norm (1a, 2b)
    key = f.norm(
        f.linear(latent, p + "indexer.wk.weight", quantized_input=False), p + "indexer.k_norm.weight"
    )
    key = f.rope(key, entry_pos, plan.rope_theta, plan.use_yarn)  # serving: BF16 before MXFP4 (1b, 2b)
    f.record(f"ckv_pre.{plan.index}", ckv)
    f.record(f"kidx_pre.{plan.index}", key)
    f.record(f"closes.{plan.index}", closes)
    table, writers = f.step[f"block_table_r{plan.ratio}"], cache_writers(f.step)
    for name, value, fmt in (
        (f"ckv.{plan.index}", ckv, f.num.nvfp4_fmt),
        (f"kidx.{plan.index}", key, "mxfp4_g32"),
    ):
        entries = op.cache_encode(value, fmt=fmt)
        f.new_caches[name] = op.paged_write(f.caches[name], entries, entry_ids, closes, writers, table)


def cache_writers(step: Mapping[str, Tracer]) -> Tracer:
    """seq_ids for the compressed caches' paged_write, with -1 on the rows replayed after a prefix-cache
    hit: they recompute entries that shared cached pages already hold and must not write them (their SWA
    context may be truncated, so their values can differ); paged_write skips a row of seq id -1 as it
    skips padding. The same equations in every layer: CSE keeps one pair per step."""
    return op.where(op.equal(step["is_replay"], 0), step["seq_ids"], -1)


def _select(f: Forward, plan: LayerPlan, u: Tracer, c: Tracer) -> None:
    """An index layer: score visible entries of its KV source, restrict to candidates, take top-k."""
    p, t = f"layers.{plan.index}.attn.indexer.", f.text
    positions, seq_ids = f.step["positions"], f.step["seq_ids"]
    # serving: indexer wq_b output and its RoPE output in BF16 before MXFP4 (1b, 2b; fused RoPE reads BF16)
    q = op.reshape(f.linear(c, p + "wq_b.weight"), shape=(c.shape[0], t.index_n_heads, t.index_head_dim))
    q = f.rope(q, positions, plan.rope_theta, plan.use_yarn)
    f.record(f"iq_pre.{plan.index}", q)
    q = op.act_qdq(q, fmt="mxfp4_g32")
    # serving: head weights = the weights_proj output rounded to BF16 (3b `.bfloat16()`), which
    # index_scores reads as f32
    w = f.linear(u, p + "weights_proj.weight", quantized_input=False)
    if f.num.scale_index_weights:
        w = f.cast(w, "f32") * float((t.index_head_dim * t.index_n_heads) ** -0.5)
    f.record(f"index_w.{plan.index}", w)
    keys = f.cache(f"kidx.{plan.kv_source}")
    table = f.step[f"block_table_r{plan.ratio}"]
    scores = op.index_scores(q, w, keys, table, positions, seq_ids, ratio=plan.ratio)
    f.record(f"index_scores.{plan.index}", scores)
    if plan.is_candidate_source:
        f.candidates = op.candidate_mask(
            scores, block_size=t.candidate_block_size, topk_blocks=t.candidate_topk_blocks
        )
        f.record(f"candidates.{plan.index}", f.candidates)
    if plan.uses_candidates and f.candidates is not None:
        scores = op.where(f.candidates, scores, NEG_INF)
    f.topk[plan.index] = op.topk_select(scores, k=t.index_topk)
    f.record(f"topk.{plan.index}", f.topk[plan.index])


def _output(f: Forward, plan: LayerPlan, o: Tracer, prefix: str | None = None) -> Tracer:
    """Inverse RoPE at the query position, grouped low-rank wo_a, then wo_b (`prefix`: a DSpark stage's)."""
    p, t = prefix or f"layers.{plan.index}.attn.", f.text
    o = f.rope(o, f.step["positions"], plan.rope_theta, plan.use_yarn, inverse=True)
    name = p + "wo_a.weight"
    scale = f.weights.get(p + "wo_a.scale")
    # quantized per head before the regrouping: the same runs of 32 columns as per group (both widths are
    # multiples of 32), and the quantization then reads the rope's own output (one kernel on cuda)
    o = f.cast(o, f.w(name).dtype) if scale is None else f.act_quantize(o)
    per_group = t.num_attention_heads * t.head_dim // t.o_groups
    grouped = op.reshape(o, shape=(o.shape[0], t.o_groups, per_group))
    # serving: the wo_a einsum writes wo_b's FP8 input from its f32 accumulator, no BF16 first (2d)
    fp8_out = f.num.act_quant != "none" and p + "wo_b.scale" in f.weights
    out_dtype = "f32" if fp8_out else f.num.act_dtype
    if scale is None:
        z = op.grouped_linear(grouped, f.w(name), out_dtype=out_dtype)
    else:
        z = op.grouped_linear(grouped, f.w(name), scale, weight_format="fp8_block32", out_dtype=out_dtype)
    z = op.reshape(z, shape=(z.shape[0], t.o_groups * t.o_lora_rank))
    # wo_b quantizes its f32 input itself (act_quantize: FP8-g32 values stored in bf16, where they are
    # exact), so its GEMM runs plain bf16 operands
    return f.linear(z, p + "wo_b.weight")


def attention(f: Forward, plan: LayerPlan, u: Tracer) -> Tracer:
    """`u` [T, H] is attn_norm(collapse(X)); returns the attention output [T, H]."""
    p, t = f"layers.{plan.index}.attn.", f.text
    positions, seq_ids, seq_slot, seq_start = _step_args(f)
    c = f.norm(f.linear(u, p + "wq_a.weight"), p + "q_norm.weight")
    q = op.reshape(f.linear(c, p + "wq_b.weight"), shape=(c.shape[0], t.num_attention_heads, t.head_dim))
    q = f.rope(q, positions, plan.rope_theta, plan.use_yarn)
    ring = f.caches[f"swa.{plan.index}"]  # the ring before this step's write
    kv = _swa_kv(f, plan, u)
    if plan.mode is LayerMode.FULL and plan.index not in f.compressed:
        _compress(f, plan, u)
    if plan.mode in (LayerMode.FULL, LayerMode.REINDEX):
        _select(f, plan, u, c)
    sink = f.w(p + "attn_sink")
    common = dict(window=t.sliding_window, softmax_scale=float(t.head_dim**-0.5))
    kv = f.cast(kv, q.dtype)
    # SWA keys below seq_window_start (a prefix hit's replay start) are not this request's: never read.
    swa = (q, kv, ring, sink, positions, seq_ids, seq_slot, seq_start, f.step["seq_window_start"])
    if plan.mode is LayerMode.SWA:
        o = op.attention(*swa, **common)
    else:
        pool = f.cache(f"ckv.{plan.kv_source}")
        table = f.step[f"block_table_r{plan.ratio}"]
        topk = f.topk[plan.topk_source]
        o = op.attention(*swa, pool, table, topk, **common)
    return _output(f, plan, o)
