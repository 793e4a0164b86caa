"""Shape ops: reshape, transpose, broadcast, concat, slice and row gathers."""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params, shape_field
from dsgraph.graph.types import Dim, TensorType
from dsgraph.ops import rules as R


def _split(shape: tuple[Dim, ...]) -> tuple[list[str], int]:
    symbols = [d for d in shape if isinstance(d, str)]
    size = 1
    for d in shape:
        if isinstance(d, int):
            size *= d
    return symbols, size


@params
class ReshapeParams:
    shape: tuple[Dim, ...] = shape_field()


def _reshape_rule(p: ReshapeParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    # Symbolic dims cannot be merged or split: they must appear in the same order on both sides.
    (sym_in, n_in), (sym_out, n_out) = _split(ts[0].shape), _split(p.shape)
    if sym_in != sym_out or n_in != n_out:
        raise ShapeError(f"cannot reshape {ts[0]} to {p.shape}")
    return (TensorType(tuple(p.shape), ts[0].dtype),)


reshape = declare_op(
    "reshape",
    ReshapeParams,
    _reshape_rule,
    "`x [*]` -> `[shape]`, same elements in row-major order; symbolic dims keep their order.",
    num_inputs=1,
)


@params
class TransposeParams:
    perm: tuple[int, ...]


def _transpose_rule(p: TransposeParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    t = ts[0]
    if sorted(p.perm) != list(range(t.rank)):
        raise ShapeError(f"perm {p.perm} is not a permutation of the {t.rank} axes of {t}")
    return (t.with_shape(tuple(t.shape[i] for i in p.perm)),)


transpose = declare_op(
    "transpose", TransposeParams, _transpose_rule, "`x [d0..dn]` -> `[d_perm0..d_permn]`.", num_inputs=1
)


@params
class BroadcastParams:
    shape: tuple[Dim, ...] = shape_field()


def _broadcast_rule(p: BroadcastParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if R.broadcast_shapes(ts[0].shape, p.shape) != tuple(p.shape):
        raise ShapeError(f"cannot broadcast {ts[0]} to {p.shape}")
    return (TensorType(tuple(p.shape), ts[0].dtype),)


broadcast_to = declare_op(
    "broadcast_to",
    BroadcastParams,
    _broadcast_rule,
    "`x [*]` -> `[shape]` (numpy broadcasting).",
    num_inputs=1,
)


@params
class AxisParams:
    axis: int


def _concat_rule(p: AxisParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if not ts:
        raise ShapeError("concat needs at least one operand")
    dtype = R.same_dtype(ts)
    axis = R.norm_axis(p.axis, ts[0].rank)
    total = 0
    for t in ts:
        if t.rank != ts[0].rank or any(t.shape[i] != ts[0].shape[i] for i in range(t.rank) if i != axis):
            raise ShapeError(f"concat along {axis}: {t} does not match {ts[0]}")
        if not isinstance(t.shape[axis], int):
            raise ShapeError(f"concat along symbolic dim {t.shape[axis]!r} is not supported")
        total += t.shape[axis]
    shape = tuple(total if i == axis else d for i, d in enumerate(ts[0].shape))
    return (TensorType(shape, dtype),)


concat = declare_op(
    "concat", AxisParams, _concat_rule, "`xs... [*, d_i, *]` -> `[*, sum d_i, *]` along axis."
)


@params
class SliceParams:
    axis: int
    start: int
    stop: int


def _slice_rule(p: SliceParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    t = ts[0]
    axis = R.norm_axis(p.axis, t.rank)
    size = t.shape[axis]
    if not 0 <= p.start <= p.stop or (isinstance(size, int) and p.stop > size):
        raise ShapeError(f"slice [{p.start}:{p.stop}] out of range for dim {axis} of {t}")
    return (t.with_shape(tuple(p.stop - p.start if i == axis else d for i, d in enumerate(t.shape))),)


slice_ = declare_op(
    "slice",
    SliceParams,
    _slice_rule,
    "`x [*, d, *]` -> `[*, stop-start, *]`: x[start:stop] on axis.",
    num_inputs=1,
)


def _gather_rows_rule(_p: object, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    table, index = ts
    R.require_dtype(index, ("i32", "i64"), "index")
    if table.rank < 1:
        raise ShapeError(f"table must have rank >= 1, got {table}")
    return (TensorType((*index.shape, *table.shape[1:]), table.dtype),)


@params
class GatherParams:
    """No params; a distinct type keeps the op self-describing in dumps."""


gather_rows = declare_op(
    "gather_rows",
    GatherParams,
    _gather_rows_rule,
    "`table [n, *r], index [*i] i32/i64` -> `[*i, *r]`: table[index]; an index outside [0, n) is an error.",
    num_inputs=2,
)
