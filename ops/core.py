"""Core tensor ops: elementwise, casts, reductions, matmul and shape manipulation.

Operand shapes are written with named dims: `[*, d]` is any leading dims then `d`.
"""

from __future__ import annotations

from dsgraph.graph.op import NoParams, ShapeError, declare_op, params
from dsgraph.graph.types import DTYPE_SIZES, INT_DTYPES, TensorType
from dsgraph.ops import rules as R


def _binary_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    return (TensorType(R.broadcast_shapes(ts[0].shape, ts[1].shape), R.same_dtype(ts)),)


def _compare_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    R.same_dtype(ts)
    return (TensorType(R.broadcast_shapes(ts[0].shape, ts[1].shape), "bool"),)


def _unary_float_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    R.require_float(ts[0], "operand")
    return (ts[0],)


def _unary_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    return (ts[0],)


_BINARY_DOC = "`a [*], b [*]` (broadcasting, same dtype) -> `[*]` of that dtype, elementwise {what}."
add = declare_op("add", NoParams, _binary_rule, _BINARY_DOC.format(what="a + b"), num_inputs=2)
sub = declare_op("sub", NoParams, _binary_rule, _BINARY_DOC.format(what="a - b"), num_inputs=2)
mul = declare_op("mul", NoParams, _binary_rule, _BINARY_DOC.format(what="a * b"), num_inputs=2)


def _int_binary_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    dtype = R.same_dtype(ts)
    if dtype not in INT_DTYPES:
        raise ShapeError(f"operands must be integers, got {dtype}")
    return (TensorType(R.broadcast_shapes(ts[0].shape, ts[1].shape), dtype),)


def _float_binary_rule(p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    R.require_float(ts[0], "a")
    return _binary_rule(p, ts)


div = declare_op(
    "div", NoParams, _float_binary_rule, _BINARY_DOC.format(what="a / b (floats only)"), num_inputs=2
)
floor_div = declare_op(
    "floor_div", NoParams, _int_binary_rule, "`a [*] int, b [*] int` -> `[*]`, floor(a / b).", num_inputs=2
)
maximum = declare_op("maximum", NoParams, _binary_rule, _BINARY_DOC.format(what="max(a, b)"), num_inputs=2)
minimum = declare_op("minimum", NoParams, _binary_rule, _BINARY_DOC.format(what="min(a, b)"), num_inputs=2)
less = declare_op("less", NoParams, _compare_rule, "`a [*], b [*]` -> `[*] bool`, a < b.", num_inputs=2)
equal = declare_op("equal", NoParams, _compare_rule, "`a [*], b [*]` -> `[*] bool`, a == b.", num_inputs=2)

_UNARY_DOC = "`x [*] float` -> `[*]` same dtype, elementwise {what}."
neg = declare_op("neg", NoParams, _unary_rule, "`x [*]` -> `[*]`, -x.", num_inputs=1)
abs_ = declare_op("abs", NoParams, _unary_rule, "`x [*]` -> `[*]`, |x|.", num_inputs=1)
exp = declare_op("exp", NoParams, _unary_float_rule, _UNARY_DOC.format(what="e^x"), num_inputs=1)
log = declare_op("log", NoParams, _unary_float_rule, _UNARY_DOC.format(what="ln x"), num_inputs=1)
sqrt = declare_op("sqrt", NoParams, _unary_float_rule, _UNARY_DOC.format(what="sqrt x"), num_inputs=1)
rsqrt = declare_op("rsqrt", NoParams, _unary_float_rule, _UNARY_DOC.format(what="1/sqrt x"), num_inputs=1)
sigmoid = declare_op(
    "sigmoid", NoParams, _unary_float_rule, _UNARY_DOC.format(what="1/(1+e^-x)"), num_inputs=1
)
silu = declare_op("silu", NoParams, _unary_float_rule, _UNARY_DOC.format(what="x*sigmoid(x)"), num_inputs=1)
relu = declare_op("relu", NoParams, _unary_float_rule, _UNARY_DOC.format(what="max(x, 0)"), num_inputs=1)
softplus = declare_op(
    "softplus", NoParams, _unary_float_rule, _UNARY_DOC.format(what="ln(1+e^x)"), num_inputs=1
)


def _where_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    R.require_dtype(ts[0], ("bool",), "cond")
    shape = R.broadcast_shapes(R.broadcast_shapes(ts[0].shape, ts[1].shape), ts[2].shape)
    return (TensorType(shape, R.same_dtype(ts[1:])),)


where = declare_op(
    "where",
    NoParams,
    _where_rule,
    "`cond [*] bool, a [*], b [*]` -> `[*]`, a where cond else b.",
    num_inputs=3,
)


@params
class CastParams:
    dtype: str


def _cast_rule(p: CastParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if p.dtype not in DTYPE_SIZES:
        raise ShapeError(f"unknown dtype {p.dtype!r}")
    return (ts[0].with_dtype(p.dtype),)


cast = declare_op(
    "cast",
    CastParams,
    _cast_rule,
    "`x [*]` -> `[*] dtype`; float->float rounds to nearest even.",
    num_inputs=1,
)


@params
class AddF32Params:
    out_dtype: str


def _add_f32_rule(p: AddF32Params, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    a, b = ts
    R.require_float(a, "a")
    R.require_float(b, "b")
    if p.out_dtype not in DTYPE_SIZES:
        raise ShapeError(f"out_dtype: unknown dtype {p.out_dtype!r}")
    return (TensorType(R.broadcast_shapes(a.shape, b.shape), p.out_dtype),)


add_f32 = declare_op(
    "add_f32",
    AddF32Params,
    _add_f32_rule,
    "`a [*], b [*]` (any float dtypes) -> `[*] out_dtype`: a and b converted to f32 (exactly), added "
    "in f32, rounded once to out_dtype: `cast(cast(a, f32) + cast(b, f32), out_dtype)` in one op (the "
    "MoE's routed sum plus its shared expert).",
    num_inputs=2,
)


@params
class ReduceParams:
    axes: tuple[int, ...]
    keepdims: bool = False


def _reduce_rule(p: ReduceParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    t = ts[0]
    axes = {R.norm_axis(a, t.rank) for a in p.axes}
    if len(axes) != len(p.axes):
        raise ShapeError(f"repeated axis in {p.axes}")
    shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape) if p.keepdims or i not in axes)
    return (t.with_shape(shape),)


_RED_DOC = "`x [*]` -> `x` without `axes` (kept as 1 with keepdims), {what}; floats accumulate in f32."
reduce_sum = declare_op("reduce_sum", ReduceParams, _reduce_rule, _RED_DOC.format(what="sum"), num_inputs=1)
reduce_max = declare_op("reduce_max", ReduceParams, _reduce_rule, _RED_DOC.format(what="max"), num_inputs=1)
reduce_mean = declare_op(
    "reduce_mean", ReduceParams, _reduce_rule, _RED_DOC.format(what="mean"), num_inputs=1
)


def _matmul_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    a, b = ts
    R.require_float(a, "a")
    dtype = R.same_dtype(ts)
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"matmul needs rank >= 2 operands, got {a} and {b}")
    R.require_dim(b.shape[-2], a.shape[-1], f"contracted dim of {a} @ {b}")
    batch = R.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return (TensorType((*batch, a.shape[-2], b.shape[-1]), dtype),)


matmul = declare_op(
    "matmul",
    NoParams,
    _matmul_rule,
    "`a [*b, m, k], b [*b, k, n]` (batch dims broadcast, same float dtype) -> `[*b, m, n]`; "
    "f32 accumulation.",
    num_inputs=2,
)
