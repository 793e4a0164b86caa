"""The V4.1 backbone as one traced step: embedding, Engram, 40 blocks with single-pass mHC, head.

`forward(f)` reads the step inputs, caches and weights held by the `Forward` and returns the logits of
the rows in `sample_rows` plus every updated cache. One graph serves prefill chunks and decode steps.
With `dspark_layers` (the config's `dspark_target_layer_ids`) it also writes every row's DSpark context
key into the `dspark.ring{s}` caches (models/deepseek_v41/dspark_context.py).
"""

from __future__ import annotations

from dsgraph.models.deepseek_v41.attention_block import attention
from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.dspark_context import stream_mean, write_context
from dsgraph.models.deepseek_v41.engram_hash import EngramLayerHash
from dsgraph.models.deepseek_v41.ffn_block import engram, moe
from dsgraph.models.deepseek_v41.layers_plan import LayerPlan
from dsgraph.models.deepseek_v41.truncation import decoder_start, enter_decoder
from dsgraph.ops import op


def _hc(f: Forward, x: Tracer, p: str) -> tuple[Tracer, Tracer, Tracer]:
    t = f.text
    return op.hc_pre(
        x,
        f.w(p + "_fn"),
        f.w(p + "_base"),
        f.w(p + "_scale"),
        sinkhorn_iters=t.hc_sinkhorn_iters,
        eps=float(t.hc_eps),
        norm_eps=float(t.rms_norm_eps),
    )


def _collapse(f: Forward, x: Tracer, a: Tracer | None) -> Tracer:
    if a is None:  # the one-hot start: stream 0
        return op.reshape(op.slice(x, axis=1, start=0, stop=1), shape=(x.shape[0], f.text.hidden_size))
    return op.hc_collapse(x, a, out_dtype=f.num.act_dtype)


def block(
    f: Forward, plan: LayerPlan, x: Tracer, a: Tracer | None, table: EngramLayerHash | None
) -> tuple[Tracer, Tracer]:
    """Spec 4.2: x [T, n, H] streams, `a` the pre-mix handed over by the previous sublayer."""
    p = f"layers.{plan.index}."
    if table is not None:
        x = engram(f, plan.index, table, x)
    pre_a, post_a, comb_a = _hc(f, x, p + "hc_attn")
    u = f.norm(_collapse(f, x, a), p + "attn_norm.weight")
    x = op.hc_expand(attention(f, plan, u), x, post_a, comb_a)
    pre_f, post_f, comb_f = _hc(f, x, p + "hc_ffn")
    u = f.norm(op.hc_collapse(x, pre_a, out_dtype=f.num.act_dtype), p + "ffn_norm.weight")
    x = op.hc_expand(moe(f, plan.index, u), x, post_f, comb_f)
    return x, pre_f


def embed(f: Forward) -> Tracer:
    t = f.text
    e = f.cast(op.gather_rows(f.w("embed.weight"), f.step["token_ids"]), f.num.act_dtype)
    e = op.reshape(e, shape=("tokens", 1, t.hidden_size))
    return op.broadcast_to(e, shape=("tokens", t.hc_mult, t.hidden_size))


def head(f: Forward, x: Tracer, a: Tracer | None) -> Tracer:
    h = f.norm(_collapse(f, x, a), "norm.weight")
    rows = op.gather_rows(h, f.step["sample_rows"])
    w = f.w("head.weight")
    return op.linear(f.cast(rows, w.dtype), w, out_dtype="f32")


def forward(
    f: Forward,
    plans: tuple[LayerPlan, ...],
    tables: dict[int, EngramLayerHash],
    dspark_layers: tuple[int, ...] = (),
    truncation: str = "off",
) -> dict[str, Tracer]:
    """`truncation` "mask" / "compact": a truncated prefill step (models/deepseek_v41/truncation.py)."""
    x, a = embed(f), None
    features: list[Tracer] = []
    boundary = decoder_start(f.text) if truncation != "off" else -1
    for plan in plans:
        if plan.index == boundary:
            x, a = enter_decoder(f, truncation, plan, x, a)
        table = tables.get(plan.index)
        if plan.index in dspark_layers:  # the residual entering the layer: after its Engram (spec 7.1)
            if table is not None:
                x, table = engram(f, plan.index, table, x), None
            features.append(stream_mean(f, x))
        x, a = block(f, plan, x, a, table)
    out = {"logits": head(f, x, a)}
    if features:
        write_context(f, features)
    out["caches"] = dict(f.new_caches)
    if f.debug is not None:
        out["debug"] = dict(f.debug)
    return out
