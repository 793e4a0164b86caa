"""Tensor types of the IR: a shape of ints or named symbolic dims, and a dtype name."""

from __future__ import annotations

from dataclasses import dataclass

# dtype name -> bytes per element. Packed formats (FP4 pairs, cache entries) are stored as u8/i8.
DTYPE_SIZES: dict[str, int] = {
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "f8e4m3": 1,
    "e8m0": 1,
    "u8": 1,
    "i8": 1,
    "i32": 4,
    "i64": 8,
    "bool": 1,
}
FLOAT_DTYPES = frozenset({"f32", "bf16", "f16", "f8e4m3"})
INT_DTYPES = frozenset({"u8", "i8", "i32", "i64"})

Dim = int | str


class TypeError_(TypeError):
    """A malformed type (bad dtype name or dim)."""


def _check_dim(dim: object) -> None:
    if isinstance(dim, bool) or not isinstance(dim, (int, str)):
        raise TypeError_(f"dim {dim!r} must be an int or a symbolic name")
    if isinstance(dim, int) and dim < 0:
        raise TypeError_(f"dim {dim} must be >= 0")
    if isinstance(dim, str) and not dim.isidentifier():
        raise TypeError_(f"symbolic dim {dim!r} must be an identifier")


@dataclass(frozen=True, slots=True)
class TensorType:
    """`shape` holds ints or symbolic dim names (e.g. "tokens"); `dtype` is a key of DTYPE_SIZES."""

    shape: tuple[Dim, ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_SIZES:
            raise TypeError_(f"unknown dtype {self.dtype!r}; known: {sorted(DTYPE_SIZES)}")
        if not isinstance(self.shape, tuple):
            raise TypeError_(f"shape must be a tuple, got {self.shape!r}")
        for dim in self.shape:
            _check_dim(dim)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_concrete(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(d for d in self.shape if isinstance(d, str))

    def numel(self) -> int:
        if not self.is_concrete:
            raise TypeError_(f"{self} has symbolic dims {sorted(self.symbols)}; specialize it first")
        count = 1
        for dim in self.shape:
            count *= int(dim)
        return count

    def nbytes(self) -> int:
        return self.numel() * DTYPE_SIZES[self.dtype]

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(shape, self.dtype)

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


def parse_type(text: str) -> TensorType:
    """Inverse of `str(TensorType)`: "f32[tokens,64]" -> TensorType(("tokens", 64), "f32")."""
    dtype, _, rest = text.partition("[")
    if not rest.endswith("]"):
        raise TypeError_(f"cannot parse type {text!r}; expected like 'f32[tokens,64]'")
    body = rest[:-1]
    dims = tuple(int(d) if d.isdigit() else d for d in body.split(",")) if body else ()
    return TensorType(dims, dtype)
