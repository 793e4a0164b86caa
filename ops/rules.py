"""Shape/dtype rule helpers shared by op declarations (pure Python)."""

from __future__ import annotations

from collections.abc import Sequence

from dsgraph.graph.op import ShapeError
from dsgraph.graph.types import FLOAT_DTYPES, Dim, TensorType


def broadcast_shapes(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Numpy broadcasting, right-aligned; symbolic dims only broadcast against 1 or the same name."""
    out: list[Dim] = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            raise ShapeError(f"shapes {a} and {b} do not broadcast (dims {da} and {db})")
    return tuple(reversed(out))


def same_dtype(types: Sequence[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"operands have dtypes {sorted(dtypes)}; cast explicitly to one dtype")
    return dtypes.pop()


def require_float(t: TensorType, what: str) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{what} must be a float tensor, got {t}")


def require_dtype(t: TensorType, dtypes: Sequence[str], what: str) -> None:
    if t.dtype not in dtypes:
        raise ShapeError(f"{what} must have dtype in {list(dtypes)}, got {t}")


def require_rank(t: TensorType, rank: int, what: str) -> None:
    if t.rank != rank:
        raise ShapeError(f"{what} must have rank {rank}, got {t}")


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def require_dim(found: Dim, expected: Dim, what: str) -> None:
    if found != expected:
        raise ShapeError(f"{what}: expected {expected}, got {found}")
