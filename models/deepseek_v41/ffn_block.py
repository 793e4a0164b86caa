"""The MoE of one layer (spec 4.6) and the Engram residual (spec 4.3).

Comments "serving: ..." name a rounding point of `serving` numerics, with its section of
spec/numerics-nemo-vs-deepinfer.md; in `reference` numerics (act_dtype f32, no act_quant) they are no-ops.
"""

from __future__ import annotations

from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.engram_hash import EngramLayerHash
from dsgraph.ops import op


def _expert_args(f: Forward, p: str) -> tuple[list[Tracer], dict[str, str]]:
    names = [p + f"ffn.experts.{w}.weight" for w in ("w1", "w3", "w2")]
    scales = [n.removesuffix(".weight") + ".scale" for n in names]
    if scales[0] in f.weights:
        return [f.w(n) for n in names + scales], dict(weight_format="mxfp4_rows", act_quant=f.num.act_quant)
    return [f.w(n) for n in names], dict(weight_format="dense", act_quant="none")


def moe(
    f: Forward, layer: int, u: Tracer, *, prefix: str | None = None, bias: Tracer | None = None
) -> Tracer:
    """`u` [T, H] is ffn_norm(collapse(X)); routed experts + the shared expert -> [T, H]. `bias`: a
    selection bias other than the gate's `ffn.gate.bias` (V4's hash-routed layers pass one per row)."""
    t, p = f.text, prefix or f"layers.{layer}."
    gate_w = f.w(p + "ffn.gate.weight")
    weights, ids = op.moe_route(
        f.cast(u, gate_w.dtype) if gate_w.dtype == "f32" else u,
        gate_w,
        f.w(p + "ffn.gate.bias") if bias is None else bias,
        topk=t.num_experts_per_tok if prefix is None else t.dspark_num_experts_per_tok,
        routed_scaling=float(t.routed_scaling_factor),
    )
    operands, fmt = _expert_args(f, p)
    # On an expert-parallel group the experts receive a number of rows only the exchange knows: a dim of
    # this MoE's own (runtime/distributed); on one rank dispatch and combine are the identity.
    rows = "ep_rows_" + p.strip(".").replace(".", "_") if f.expert_parallel else u.shape[0]
    x_e, ids_e, weights_e, src = op.moe_dispatch(u, ids, weights, moe=p, rows=(rows,))
    # serving: each routed expert's gate/up and down GEMM outputs are BF16; the combine adds in f32 (5b)
    y = op.moe_experts(
        x_e,
        ids_e,
        weights_e,
        *operands,
        swiglu_limit=float(t.swiglu_limit),
        out_dtype="f32",
        gemm_out_dtype=f.num.act_dtype,
        **fmt,
    )
    routed = op.moe_combine(y, src, ids, moe=p)
    sp = p + "ffn.shared_experts."
    g = f.linear(u, sp + "w1.weight")  # serving: BF16 gate/up GEMM outputs (5b)
    v = f.linear(u, sp + "w3.weight")
    # serving: no BF16 SwiGLU output; the fused swiglu+cast writes w2's FP8 input from f32 (2d, 5b)
    act = op.swiglu(g, v, limit=float(t.swiglu_limit), out_dtype="f32")
    shared = f.linear(act, sp + "w2.weight")  # serving: BF16 down output, added to the routed sum (5b)
    # f32(routed) + f32(shared), rounded once to the activation dtype: cast, add, cast in one op
    return op.add_f32(routed, shared, out_dtype=f.num.act_dtype)


def engram(f: Forward, layer: int, table: EngramLayerHash, x: Tracer) -> Tracer:
    """Add the gated Engram memory of this layer to the streams x [T, n, H]."""
    t, p, s = f.text, f"layers.{layer}.engram.", f.step
    rows = op.engram_hash(
        s["token_ids"],
        s["positions"],
        s["seq_ids"],
        s["seq_start"],
        s["lookback"],
        f.w("engram.token_map"),
        primes=table.primes,
        offsets=table.offsets,
        multipliers=table.multipliers,
        pad_id=f.engram_pad_id,
        max_ngram=t.engram_max_ngram_size,
        image_token_id=f.image_token_id,
    )
    e = op.gather_dequant_rows(
        f.w(p + "embed.weight"), f.w(p + "embed.scale"), rows, out_dtype=f.num.act_dtype
    )
    j = rows.shape[1]
    e = op.reshape(e, shape=("tokens", j * t.engram_head_dim))
    kv = f.linear(e, p + "wkv.weight", "f32", quantized_input=False)  # the rows are FP8 already
    return op.engram_gate(
        x,
        kv,
        f.w(p + "q_weight"),
        f.w(p + "k_weight"),
        s["token_ids"],
        eps=float(t.rms_norm_eps),
        image_token_id=f.image_token_id,
    )
