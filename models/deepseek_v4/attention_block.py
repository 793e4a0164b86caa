"""Attention of one V4 layer (sliding window, CSA or HCA) over the step's caches.

What transformers' `DeepseekV4Attention` computes, as ops: a per-head unweighted RMSNorm of the queries,
K = V = rope(kv_norm(wkv u)), a sink per head, inverse RoPE of the output, the grouped output projection.
CSA layers add the top-k compressed entries their indexer (with its own compressor at index_head_dim)
selects; HCA layers add every visible compressed entry. Caches hold unrounded values (`CACHE_FMT`).
"""

from __future__ import annotations

from dsgraph.models.deepseek_v4.layers import Attn, LayerPlan
from dsgraph.models.deepseek_v41.attention_block import _output, cache_writers
from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.ops import op

CACHE_FMT = "f32"  # the reference keeps every cache in f32 (no quantization boundary)


def _head_rms(f: Forward, q: Tracer) -> Tracer:
    """q / sqrt(mean(q^2) + eps) per head, no weight."""
    ms = op.reduce_mean(q * q, axes=(-1,), keepdims=True)
    return q * op.rsqrt(ms + float(f.text.rms_norm_eps))


def _swa_kv(f: Forward, plan: LayerPlan, u: Tracer) -> Tracer:
    p, s = f"layers.{plan.index}.attn.", f.step
    kv = f.norm(f.linear(u, p + "wkv.weight"), p + "kv_norm.weight")
    kv = f.rope(kv, s["positions"], plan.rope_theta, plan.use_yarn)
    name = f"swa.{plan.index}"
    entries = op.cache_encode(kv, fmt=CACHE_FMT)
    f.new_caches[name] = op.swa_write(
        f.caches[name], entries, s["positions"], s["seq_ids"], s["seq_slot"], s["seq_end"]
    )
    return kv


def _compress(f: Forward, plan: LayerPlan, u: Tracer, prefix: str, state: str, pool: str) -> None:
    """Pool closed windows into entries, normalise, rotate at the window's first position, write pages."""
    s = f.step
    latent, closes, f.new_caches[state] = op.window_compress(
        f.cast(u, "f32"),
        f.w(prefix + "wkv.weight"),
        f.w(prefix + "wgate.weight"),
        f.w(prefix + "ape"),
        f.caches[state],
        s["positions"],
        s["seq_ids"],
        s["seq_slot"],
        s["seq_start"],
        ratio=plan.ratio,
        overlap=plan.overlap,
    )
    latent = f.norm(f.cast(latent, f.num.act_dtype), prefix + "norm.weight")
    entry_ids = s["positions"] // plan.ratio
    entry = f.rope(latent, entry_ids * plan.ratio, plan.rope_theta, plan.use_yarn)
    f.record(f"{pool}_pre", entry)
    f.new_caches[pool] = op.paged_write(
        f.caches[pool],
        op.cache_encode(entry, fmt=CACHE_FMT),
        entry_ids,
        closes,
        cache_writers(s),
        s[f"block_table_r{plan.ratio}"],
    )


def _select(f: Forward, plan: LayerPlan, u: Tracer, c: Tracer) -> Tracer:
    """The CSA indexer: its own compressed keys, queries from the query latent `c`, top-k entries."""
    i, t, s = plan.index, f.text, f.step
    p = f"layers.{i}.attn.indexer."
    _compress(f, plan, u, p + "compressor.", f"icomp.{i}", f"kidx.{i}")
    q = op.reshape(f.linear(c, p + "wq_b.weight"), shape=("tokens", t.index_n_heads, t.index_head_dim))
    q = f.rope(q, s["positions"], plan.rope_theta, plan.use_yarn)
    w = f.cast(f.linear(u, p + "weights_proj.weight"), "f32")
    w = w * float((t.index_head_dim * t.index_n_heads) ** -0.5)
    keys, table = f.cache(f"kidx.{i}"), s[f"block_table_r{plan.ratio}"]
    scores = op.index_scores(
        q, w, keys, table, s["positions"], s["seq_ids"], ratio=plan.ratio, key_fmt=CACHE_FMT
    )
    f.record(f"index_scores.{i}", scores)
    topk = op.topk_select(scores, k=t.index_topk)
    f.record(f"topk.{i}", topk)
    return topk


def attention(f: Forward, plan: LayerPlan, u: Tracer, entries_per_seq: int) -> Tracer:
    """`u` [T, H] is attn_norm(collapse(X)); returns the attention output [T, H]. `entries_per_seq`: the
    compressed entries a sequence's block table can hold (the HCA selection's width)."""
    i, t, s = plan.index, f.text, f.step
    p = f"layers.{i}.attn."
    c = f.norm(f.linear(u, p + "wq_a.weight"), p + "q_norm.weight")
    q = op.reshape(f.linear(c, p + "wq_b.weight"), shape=("tokens", t.num_attention_heads, t.head_dim))
    q = f.rope(_head_rms(f, q), s["positions"], plan.rope_theta, plan.use_yarn)
    ring = f.caches[f"swa.{i}"]  # the ring before this step's write
    kv = f.cast(_swa_kv(f, plan, u), q.dtype)
    swa = (q, kv, ring, f.w(p + "attn_sink"), s["positions"], s["seq_ids"], s["seq_slot"], s["seq_start"])
    common = dict(
        window=t.sliding_window, softmax_scale=float(t.head_dim**-0.5), ring_fmt=CACHE_FMT, pool_fmt=CACHE_FMT
    )
    swa = (*swa, s["seq_window_start"])
    if plan.attn is Attn.SWA:
        o = op.attention(*swa, **common)
    else:
        _compress(f, plan, u, p + "compressor.", f"comp.{i}", f"ckv.{i}")
        if plan.attn is Attn.CSA:
            chosen = _select(f, plan, u, c)
        else:
            chosen = op.visible_entries(s["positions"], s["seq_ids"], ratio=plan.ratio, width=entries_per_seq)
        o = op.attention(*swa, f.cache(f"ckv.{i}"), s[f"block_table_r{plan.ratio}"], chosen, **common)
    return _output(f, plan, o)  # type: ignore[arg-type]  (reads only plan.index, rope_theta, use_yarn)
