"""Engram ops (spec model-v41 4.3): n-gram hashing, FP8 table row lookup and the gated residual.

The backbone runs, per Engram layer: `engram_hash` -> `gather_dequant_rows` -> reshape to
[T, rows*D] -> `linear` (engram.wkv) -> `engram_gate`.
"""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import Dim, TensorType
from dsgraph.ops import rules as R

ACTIVATION_DTYPES = ("f32", "bf16", "f16")
INT64_LIMIT = 1 << 63

__all__ = ["engram_gate", "engram_hash", "gather_dequant_rows"]


def _require_shape(t: TensorType, shape: tuple[Dim, ...], what: str) -> None:
    if t.shape != shape:
        raise ShapeError(f"{what} must have shape {list(shape)}, got {t}")


@params
class EngramHashParams:
    """Hash constants of one Engram layer (`models/deepseek_v41/engram_hash.py::engram_primes`).

    primes/offsets: [orders][heads], order 2 first; multipliers: one per shift 0..max_ngram-1;
    pad_id: the compressed id of engram_pad_token_id; image_token_id: raw id that blocks (-1: none).
    """

    primes: tuple[tuple[int, ...], ...]
    offsets: tuple[tuple[int, ...], ...]
    multipliers: tuple[int, ...]
    pad_id: int
    max_ngram: int
    image_token_id: int = -1


def _check_hash_params(p: EngramHashParams) -> int:
    """Validates the constants; returns the number of heads per order."""
    if p.max_ngram < 2:
        raise ShapeError(f"max_ngram is {p.max_ngram}, expected >= 2")
    orders = p.max_ngram - 1
    if len(p.primes) != orders or len(p.offsets) != orders:
        raise ShapeError(
            f"primes and offsets need {orders} orders (2..{p.max_ngram}), "
            f"got {len(p.primes)} and {len(p.offsets)}"
        )
    heads = len(p.primes[0])
    for order, (ps, os_) in enumerate(zip(p.primes, p.offsets, strict=True), start=2):
        if len(ps) != heads or len(os_) != heads or heads < 1:
            raise ShapeError(
                f"order {order}: {len(ps)} primes and {len(os_)} offsets, expected {heads} of each"
            )
        if min(ps) < 2 or min(os_) < 0:
            raise ShapeError(f"order {order}: primes {ps} must be >= 2 and offsets {os_} >= 0")
    if len(p.multipliers) != p.max_ngram or min(p.multipliers) < 1:
        raise ShapeError(f"multipliers {p.multipliers} must be {p.max_ngram} positive ints (one per shift)")
    if p.pad_id < 0 or p.pad_id * max(p.multipliers) >= INT64_LIMIT:
        raise ShapeError(f"pad_id {p.pad_id} must be >= 0 and pad_id * multiplier must fit int64")
    return heads


def _engram_hash_rule(p: EngramHashParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    heads = _check_hash_params(p)
    token_ids, positions, seq_ids, seq_start, lookback, token_map = ts
    names = ("token_ids", "positions", "seq_ids", "seq_start", "lookback", "token_map")
    for t, what in zip(ts, names, strict=True):
        R.require_dtype(t, ("i32",), what)
    R.require_rank(token_ids, 1, "token_ids")
    tokens = token_ids.shape[0]
    _require_shape(positions, (tokens,), "positions (like token_ids)")
    _require_shape(seq_ids, (tokens,), "seq_ids (like token_ids)")
    R.require_rank(seq_start, 1, "seq_start")
    _require_shape(lookback, (seq_start.shape[0], p.max_ngram - 1), "lookback [S, max_ngram-1]")
    R.require_rank(token_map, 1, "token_map")
    return (TensorType((tokens, (p.max_ngram - 1) * heads), "i64"),)


engram_hash = declare_op(
    "engram_hash",
    EngramHashParams,
    _engram_hash_rule,
    "`token_ids [T] i32, positions [T] i32, seq_ids [T] i32, seq_start [S] i32, lookback [S, m-1] i32, "
    "token_map [V] i32` -> `[T, (m-1)*heads] i64` (m = max_ngram): table rows of each token's n-grams, "
    "order-major (order 2 heads 0.., then order 3, ...). c_s = token_map[id of position p-s], taken from the "
    "chunk when p-s >= seq_start[seq] else from lookback[seq, seq_start-(p-s)-1] (most recent first); a "
    "shift before position 0, a -1 lookback or an image_token_id token is blocked, and so is every larger "
    "shift (c = pad_id); h_n = xor of c_s * multipliers[s] for s < n (int64); "
    "row = h_n mod primes[n-2][j] + offsets[n-2][j]. Padding rows (seq_id -1) give 0.",
    num_inputs=6,
)


@params
class GatherDequantRowsParams:
    out_dtype: str = "f32"


def _gather_dequant_rows_rule(
    p: GatherDequantRowsParams, ts: tuple[TensorType, ...]
) -> tuple[TensorType, ...]:
    table, scale, rows = ts
    R.require_dtype(table, ("f8e4m3",), "table")
    R.require_rank(table, 2, "table")
    R.require_dtype(scale, ("e8m0",), "scale")
    R.require_dtype(rows, ("i64",), "rows")
    width = table.shape[1]
    if not isinstance(width, int) or width <= 0 or width % 32:
        raise ShapeError(
            f"table width is {width}, expected a positive multiple of 32 (one scale per 32 columns)"
        )
    _require_shape(scale, (table.shape[0], width // 32), "scale [R, D/32]")
    if p.out_dtype not in ACTIVATION_DTYPES:
        raise ShapeError(f"out_dtype {p.out_dtype!r} is not one of {list(ACTIVATION_DTYPES)}")
    return (TensorType((*rows.shape, width), p.out_dtype),)


gather_dequant_rows = declare_op(
    "gather_dequant_rows",
    GatherDequantRowsParams,
    _gather_dequant_rows_rule,
    "`table [R, D] f8e4m3, scale [R, D/32] e8m0, rows [*r] i64` -> `[*r, D] out_dtype`: "
    "table[row, c] * 2^(scale[row, c // 32] - 127) in f32, cast once; a row outside [0, R) is an error "
    "naming its position (Engram tables).",
    num_inputs=3,
)


@params
class EngramGateParams:
    eps: float
    image_token_id: int


def _engram_gate_rule(p: EngramGateParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    x, kv, qw, kw, token_ids = ts
    R.require_dtype(x, ACTIVATION_DTYPES, "x")
    R.require_rank(x, 3, "x")
    tokens, streams, hidden = x.shape
    if not isinstance(streams, int) or not isinstance(hidden, int):
        raise ShapeError(f"x {x}: the stream and hidden dims must be concrete")
    R.require_dtype(kv, ("f32",), "kv")
    _require_shape(kv, (tokens, (streams + 1) * hidden), "kv [T, (n+1)*H]")
    R.require_dtype(qw, ACTIVATION_DTYPES, "qw")
    _require_shape(qw, (streams, hidden), "qw [n, H]")
    R.require_dtype(kw, ACTIVATION_DTYPES, "kw")
    _require_shape(kw, (streams, hidden), "kw [n, H]")
    R.require_dtype(token_ids, ("i32",), "token_ids")
    _require_shape(token_ids, (tokens,), "token_ids [T]")
    if not p.eps >= 0:
        raise ShapeError(f"eps is {p.eps}, expected >= 0")
    return (x,)


engram_gate = declare_op(
    "engram_gate",
    EngramGateParams,
    _engram_gate_rule,
    "`x [T, n, H] f32|bf16|f16, kv [T, (n+1)*H] f32, qw [n, H] float, kw [n, H] float, token_ids [T] i32` -> "
    "`[T, n, H]` x's dtype: K = kv[:, :n*H] as [n, H], v = kv[:, n*H:]; per stream m, "
    "d = sum(x_m * (qw_m * kw_m) * K_m) * rsqrt(mean(x_m^2) + eps) * rsqrt(mean(K_m^2) + eps) * H^-0.5, "
    "g = sigmoid(copysign(sqrt(max(|d|, 1e-6)), d)), out_m = x_m + g * v, all in f32, cast once. "
    "g = 0 (row unchanged) where token_ids == image_token_id or token_ids < 0 (padding).",
    num_inputs=5,
)
