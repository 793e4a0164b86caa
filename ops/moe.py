"""Mixture-of-experts ops: the router, the routed experts and the clamped SwiGLU (spec model-v41 4.6).

The shared expert is not an op of its own: it is `linear` w1, `linear` w3, `swiglu`, `linear` w2.
"""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params, shape_field
from dsgraph.graph.types import Dim, TensorType
from dsgraph.ops import rules as R

ACTIVATION_DTYPES = ("f32", "bf16", "f16")
WEIGHT_FORMATS = ("dense", "mxfp4_rows")
ACT_QUANTS = ("none", "fp8_g32")

__all__ = [
    "ACT_QUANTS",
    "WEIGHT_FORMATS",
    "moe_combine",
    "moe_dispatch",
    "moe_experts",
    "moe_route",
    "swiglu",
]


def _require_shape(t: TensorType, shape: tuple[Dim, ...], what: str) -> None:
    if t.shape != shape:
        raise ShapeError(f"{what} must have shape {list(shape)}, got {t}")


def _require_multiple(dim: Dim, group: int, what: str) -> None:
    if not isinstance(dim, int) or dim <= 0 or dim % group:
        raise ShapeError(f"{what} is {dim}, expected a positive multiple of {group}")


def _require_out_dtype(out_dtype: str) -> None:
    if out_dtype not in ACTIVATION_DTYPES:
        raise ShapeError(f"out_dtype {out_dtype!r} is not one of {list(ACTIVATION_DTYPES)}")


def _require_limit(limit: float, what: str) -> None:
    if not limit > 0:
        raise ShapeError(f"{what} is {limit}, expected a positive clamp limit")


@params
class MoeRouteParams:
    topk: int
    routed_scaling: float


def _moe_route_rule(p: MoeRouteParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    u, gate_w, bias = ts
    R.require_dtype(u, ACTIVATION_DTYPES, "u")
    R.require_rank(u, 2, "u")
    R.require_dtype(gate_w, ACTIVATION_DTYPES, "gate_w")
    R.require_rank(gate_w, 2, "gate_w")
    R.require_dim(gate_w.shape[1], u.shape[1], f"gate_w {gate_w} hidden width vs u {u}")
    R.require_dtype(bias, ("f32",), "bias")
    num_experts = gate_w.shape[0]
    if bias.shape not in ((num_experts,), (u.shape[0], num_experts)):
        raise ShapeError(f"bias must have shape [{num_experts}] or [{u.shape[0]}, {num_experts}], got {bias}")
    if p.topk < 1 or (isinstance(num_experts, int) and p.topk > num_experts):
        raise ShapeError(f"topk is {p.topk}, expected 1 <= topk <= {num_experts} (the experts of gate_w)")
    k = p.topk
    return TensorType((u.shape[0], k), "f32"), TensorType((u.shape[0], k), "i32")


moe_route = declare_op(
    "moe_route",
    MoeRouteParams,
    _moe_route_rule,
    "`u [T, H] f32|bf16|f16, gate_w [E, H] f32|bf16|f16, bias [E] or [T, E] f32` -> "
    "`(weights [T, topk] f32, ids [T, topk] i32)`: logits = gate_w . u in f32, s = sqrt(softplus(logits)); "
    "the topk experts of s + bias (the bias only selects; equal scores -> lowest expert id first), in "
    "descending order of s + bias; weights = s[ids] / (sum s[ids] + 1e-20) * routed_scaling. A [T, E] bias "
    "picks a bias per row (image rows use the gate's bias_vl).",
    num_inputs=3,
)


@params
class MoeDispatchParams:
    moe: str  # the MoE's weight prefix: names its expert placement on an EP group
    # (rows,): the rows the experts receive; x's rows on one rank, a dim of this MoE's own on a group
    rows: tuple[Dim, ...] = shape_field()


def _require_routed_rows(x: TensorType, ids: TensorType, weights: TensorType) -> None:
    """x [rows, hidden] activations with its routing: ids [rows, k] i32, weights [rows, k] f32."""
    R.require_dtype(x, ACTIVATION_DTYPES, "x")
    R.require_rank(x, 2, "x")
    R.require_dtype(ids, ("i32",), "ids")
    R.require_rank(ids, 2, "ids")
    R.require_dim(ids.shape[0], x.shape[0], f"rows of ids {ids} vs x {x}")
    R.require_dtype(weights, ("f32",), "weights")
    _require_shape(weights, ids.shape, "weights (like ids)")


def _moe_dispatch_rule(p: MoeDispatchParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    x, ids, weights = ts
    _require_routed_rows(x, ids, weights)
    if len(p.rows) != 1:
        raise ShapeError(f"rows must be one dim, got {list(p.rows)}")
    rows, k = p.rows[0], ids.shape[1]
    return (
        TensorType((rows, x.shape[1]), x.dtype),
        TensorType((rows, k), "i32"),
        TensorType((rows, k), "f32"),
        TensorType((rows,), "i32"),
    )


moe_dispatch = declare_op(
    "moe_dispatch",
    MoeDispatchParams,
    _moe_dispatch_rule,
    "`x [T, H], ids [T, k] i32, weights [T, k] f32` -> `(x_e [rows, H], ids_e [rows, k] i32, weights_e "
    "[rows, k] f32, src [rows] i32)`: the rows this rank's experts compute. On one rank the identity "
    "(rows = T, src = 0). On an expert-parallel group (runtime/distributed) each (token, slot) pair goes to "
    "a rank holding a replica of its expert: one received row per pair, its local expert slot in column 0 "
    "and -1 (padding) in the other columns; src names the rank it came from, received rows ordered by "
    "(source rank, token, slot).",
    num_inputs=3,
)


@params
class MoeCombineParams:
    moe: str


def _moe_combine_rule(p: MoeCombineParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    y, src, ids = ts
    R.require_dtype(y, ("f32",), "y")
    R.require_rank(y, 2, "y")
    R.require_dtype(src, ("i32",), "src")
    _require_shape(src, (y.shape[0],), "src [rows]")
    R.require_dtype(ids, ("i32",), "ids")
    R.require_rank(ids, 2, "ids")
    return (TensorType((ids.shape[0], y.shape[1]), "f32"),)


moe_combine = declare_op(
    "moe_combine",
    MoeCombineParams,
    _moe_combine_rule,
    "`y [rows, H] f32 (the experts' outputs of moe_dispatch's rows), src [rows] i32, ids [T, k] i32 (the "
    "routing)` -> `[T, H] f32`: on one rank the identity (rows = T). On an expert-parallel group "
    "each pair's output returns to its token's rank, which adds a token's pairs from zero in increasing "
    "expert id order: the order and arithmetic of moe_experts' own sum, so the result equals one rank's "
    "bit for bit.",
    num_inputs=3,
)


@params
class MoeExpertsParams:
    swiglu_limit: float
    weight_format: str = "dense"
    act_quant: str = "none"
    out_dtype: str = "f32"
    gemm_out_dtype: str = "f32"


def _expert_weight_types(p: MoeExpertsParams, ws: tuple[TensorType, ...], hidden: Dim) -> Dim:
    """Checks w1, w3, w2 (and scales); returns the expert count E."""
    if p.weight_format == "dense":
        w1, w3, w2 = ws
        for t, what in ((w1, "w1"), (w3, "w3"), (w2, "w2")):
            R.require_dtype(t, ACTIVATION_DTYPES, what)
            R.require_rank(t, 3, what)
        num_experts, inter = w1.shape[0], w1.shape[1]
        _require_shape(w1, (num_experts, inter, hidden), "w1 [E, I, H]")
        _require_shape(w3, (num_experts, inter, hidden), "w3 [E, I, H]")
        _require_shape(w2, (num_experts, hidden, inter), "w2 [E, H, I]")
        return num_experts
    w1, w3, w2, s1, s3, s2 = ws
    for t, what in ((w1, "w1"), (w3, "w3"), (w2, "w2")):
        R.require_dtype(t, ("i8",), what)
        R.require_rank(t, 3, what)
    for t, what in ((s1, "s1"), (s3, "s3"), (s2, "s2")):
        R.require_dtype(t, ("e8m0",), what)
    _require_multiple(hidden, 32, "hidden width H of x (mxfp4_rows packs 32-column groups)")
    num_experts, inter = w1.shape[0], w1.shape[1]
    _require_multiple(inter, 32, f"intermediate width I of w1 {w1}")
    assert isinstance(hidden, int) and isinstance(inter, int)
    _require_shape(w1, (num_experts, inter, hidden // 2), "w1 [E, I, H/2] (packed E2M1)")
    _require_shape(w3, (num_experts, inter, hidden // 2), "w3 [E, I, H/2] (packed E2M1)")
    _require_shape(w2, (num_experts, hidden, inter // 2), "w2 [E, H, I/2] (packed E2M1)")
    _require_shape(s1, (num_experts, inter, hidden // 32), "s1 [E, I, H/32]")
    _require_shape(s3, (num_experts, inter, hidden // 32), "s3 [E, I, H/32]")
    _require_shape(s2, (num_experts, hidden, inter // 32), "s2 [E, H, I/32]")
    return num_experts


def _moe_experts_rule(p: MoeExpertsParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if p.weight_format not in WEIGHT_FORMATS:
        raise ShapeError(f"weight_format {p.weight_format!r} is not one of {list(WEIGHT_FORMATS)}")
    if p.act_quant not in ACT_QUANTS:
        raise ShapeError(f"act_quant {p.act_quant!r} is not one of {list(ACT_QUANTS)}")
    _require_out_dtype(p.out_dtype)
    if p.gemm_out_dtype not in ACTIVATION_DTYPES:
        raise ShapeError(f"gemm_out_dtype {p.gemm_out_dtype!r} is not one of {list(ACTIVATION_DTYPES)}")
    _require_limit(p.swiglu_limit, "swiglu_limit")
    want = 6 if p.weight_format == "dense" else 9
    if len(ts) != want:
        raise ShapeError(f"weight_format {p.weight_format!r} takes {want} operands, got {len(ts)}")
    x, ids, weights = ts[:3]
    _require_routed_rows(x, ids, weights)
    _expert_weight_types(p, ts[3:], x.shape[1])
    if p.act_quant == "fp8_g32":
        inter = ts[3].shape[1]
        _require_multiple(x.shape[1], 32, "hidden width H of x (fp8_g32 quantizes 32-column groups)")
        _require_multiple(inter, 32, "intermediate width I (fp8_g32 quantizes 32-column groups)")
    return (TensorType(x.shape, p.out_dtype),)


moe_experts = declare_op(
    "moe_experts",
    MoeExpertsParams,
    _moe_experts_rule,
    "`x [T, H] f32|bf16|f16, ids [T, k] i32, weights [T, k] f32, w1, w3, w2[, s1, s3, s2]` -> "
    "`[T, H] out_dtype`: sum over slots j with ids[t, j] >= 0 (a negative id is padding and adds nothing) "
    "of w2_e . a_e, e = ids[t, j], a_e = silu(min(w1_e x, L)) * clamp(w3_e x, -L, L) * weights[t, j] "
    "(L = swiglu_limit; the routing weight multiplies before w2). weight_format 'dense': w1, w3 "
    "[E, I, H] and w2 [E, H, I] float (6 operands); 'mxfp4_rows': w1, w3 i8 [E, I, H/2] and w2 i8 "
    "[E, H, I/2] packed E2M1 (low nibble = even column) with e8m0 row scales s1, s3 [E, I, H/32] and s2 "
    "[E, H, I/32] (9 operands). GEMMs and the activation in f32; act_quant 'none' rounds a to x's dtype "
    "before w2, 'fp8_g32' FP8-qdqs x (before w1/w3) and a (before w2) per 32 columns (DeepInfer); "
    "gemm_out_dtype rounds each expert's w1 x and w3 x (before the clamp) and its w2 output (before the "
    "sum) to that dtype ('bf16': DeepInfer's GEMM outputs; 'f32': no rounding). The experts' outputs "
    "accumulate in f32, cast once to out_dtype. An id >= E is an error naming the row.",
)


@params
class SwigluParams:
    limit: float
    out_dtype: str = "f32"


def _swiglu_rule(p: SwigluParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    g, v = ts
    R.require_dtype(g, ACTIVATION_DTYPES, "g")
    R.require_dtype(v, ACTIVATION_DTYPES, "v")
    if g.shape != v.shape:
        raise ShapeError(f"g {g} and v {v} must have the same shape")
    if g.rank < 1:
        raise ShapeError(f"g must have rank >= 1, got {g}")
    _require_out_dtype(p.out_dtype)
    _require_limit(p.limit, "limit")
    return (TensorType(g.shape, p.out_dtype),)


swiglu = declare_op(
    "swiglu",
    SwigluParams,
    _swiglu_rule,
    "`g [*, I] f32|bf16|f16, v [*, I] f32|bf16|f16` -> `[*, I] out_dtype`: "
    "silu(min(g, limit)) * clamp(v, -limit, limit) in f32, cast once (the shared expert's activation).",
    num_inputs=2,
)
