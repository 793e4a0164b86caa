"""Neural-network ops with fixed numerics: RMSNorm, softmax, linear (dense or FP8 weights), grouped linear."""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import Dim, TensorType
from dsgraph.ops import rules as R


@params
class RMSNormParams:
    eps: float


def _rms_norm_rule(p: RMSNormParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    x, w = ts
    R.require_float(x, "x")
    R.require_float(w, "weight")
    R.require_rank(w, 1, "weight")
    R.require_dim(w.shape[0], x.shape[-1], "weight width")
    return (x,)


rms_norm = declare_op(
    "rms_norm",
    RMSNormParams,
    _rms_norm_rule,
    "`x [*, d] float, weight [d] float` -> `[*, d]` dtype of x: "
    "w * (x / sqrt(mean(x^2) + eps)) computed in f32 (weight multiplied in f32), rounded once.",
    num_inputs=2,
)


@params
class SoftmaxParams:
    axis: int = -1


def _softmax_rule(p: SoftmaxParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    R.require_float(ts[0], "x")
    R.norm_axis(p.axis, ts[0].rank)
    return (ts[0],)


softmax = declare_op(
    "softmax",
    SoftmaxParams,
    _softmax_rule,
    "`x [*] float` -> `[*]`, softmax along axis in f32.",
    num_inputs=1,
)


WEIGHT_FORMATS = ("dense", "fp8_block32")
ACT_QUANTS = ("none", "fp8_g32")
OUT_DTYPES = ("f32", "bf16", "f16")


@params
class LinearParams:
    weight_format: str = "dense"
    act_quant: str = "none"
    out_dtype: str = "f32"


def _check_weight(p: LinearParams, ts: tuple[TensorType, ...]) -> tuple[Dim, Dim]:
    """Check params and weight operands (ts[1:]) of linear/grouped_linear; return the weight's (rows, k)."""
    if p.weight_format not in WEIGHT_FORMATS:
        raise ShapeError(f"weight_format {p.weight_format!r} is not one of {list(WEIGHT_FORMATS)}")
    if p.act_quant not in ACT_QUANTS:
        raise ShapeError(f"act_quant {p.act_quant!r} is not one of {list(ACT_QUANTS)}")
    if p.out_dtype not in OUT_DTYPES:
        raise ShapeError(f"out_dtype {p.out_dtype!r} is not one of {list(OUT_DTYPES)}")
    want = 2 if p.weight_format == "dense" else 3
    if len(ts) != want:
        raise ShapeError(
            f"weight_format {p.weight_format} takes {want} operands (x, weight[, scale]), got {len(ts)}"
        )
    w = ts[1]
    R.require_rank(w, 2, "weight")
    if p.weight_format == "dense":
        R.require_float(w, "weight")
        return w.shape[0], w.shape[1]
    R.require_dtype(w, ("f8e4m3",), "weight")
    scale = ts[2]
    R.require_dtype(scale, ("e8m0",), "scale")
    rows, cols = w.shape
    if not isinstance(rows, int) or not isinstance(cols, int):
        raise ShapeError(f"fp8_block32 weight {w} must have concrete dims")
    R.require_rank(scale, 2, "scale")
    if scale.shape != (-(-rows // 32), -(-cols // 32)):
        raise ShapeError(f"scale {scale} of weight {w}: expected shape ({-(-rows // 32)}, {-(-cols // 32)})")
    return rows, cols


def _check_x(p: LinearParams, x: TensorType, k: Dim, min_rank: int) -> None:
    R.require_float(x, "x")
    if x.rank < min_rank:
        raise ShapeError(f"x must have rank >= {min_rank}, got {x}")
    R.require_dim(x.shape[-1], k, f"in-features of x {x} vs weight")
    if p.act_quant == "fp8_g32" and (not isinstance(k, int) or k % 32):
        raise ShapeError(f"act_quant fp8_g32 needs in-features a multiple of 32, got {k} (x {x})")


def _linear_rule(p: LinearParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    n, k = _check_weight(p, ts)
    _check_x(p, ts[0], k, 1)
    return (TensorType((*ts[0].shape[:-1], n), p.out_dtype),)


_WEIGHT_DOC = (
    "weight_format dense: `weight [rows, k] float` (2 operands); fp8_block32: `weight [rows, k] f8e4m3, "
    "scale [ceil(rows/32), ceil(k/32)] e8m0` (3 operands, weight[r, c] * scale[r // 32, c // 32]). "
    "act_quant fp8_g32: x is FP8-E4M3 quantize-dequantized per row in groups of 32 along k with UE8M0 "
    "scales before the GEMM (DeepInfer's dynamic activation quantization); none: x as is. "
    "f32 accumulation, result cast to out_dtype."
)

linear = declare_op(
    "linear",
    LinearParams,
    _linear_rule,
    "`x [*, k] float, weight, [scale]` -> `[*, rows] out_dtype`: x @ weight^T. " + _WEIGHT_DOC,
)


def _grouped_linear_rule(p: LinearParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    rows, k = _check_weight(p, ts)
    x = ts[0]
    _check_x(p, x, k, 2)
    groups = x.shape[-2]
    if not isinstance(groups, int) or groups <= 0 or not isinstance(rows, int) or rows % groups:
        raise ShapeError(f"weight rows {rows} must split into the {groups} groups of x {x}")
    return (TensorType((*x.shape[:-1], rows // groups), p.out_dtype),)


grouped_linear = declare_op(
    "grouped_linear",
    LinearParams,
    _grouped_linear_rule,
    "`x [*, G, k] float, weight, [scale]` -> `[*, G, n] out_dtype` with n = rows / G: group g is "
    "x[..., g, :] @ weight[g*n:(g+1)*n]^T (V4.1's grouped low-rank output wo_a). " + _WEIGHT_DOC,
)
