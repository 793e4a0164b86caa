"""Manifold-constrained hyper-connections: coefficients, stream collapse and expand (spec model-v41 4.4).

A token carries n residual streams [n, H]. Each sublayer predicts (pre, post, comb) from the streams;
`hc_collapse` sums the streams weighted by a pre-mix into the sublayer input, `hc_expand` writes the
sublayer output back: X'_j = post_j * y + sum_i comb[i, j] * X_i (row i = input stream, column j = output).
"""

from __future__ import annotations

from dsgraph.graph.op import NoParams, ShapeError, declare_op, params
from dsgraph.graph.types import Dim, TensorType
from dsgraph.ops import rules as R

__all__ = ["hc_collapse", "hc_expand", "hc_pre"]


def _streams(x: TensorType, what: str) -> tuple[Dim, int, int]:
    """(tokens, n, H) of a float [tokens, n, H] stream tensor with concrete n and H."""
    R.require_float(x, what)
    R.require_rank(x, 3, what)
    tokens, n, hidden = x.shape
    if not isinstance(n, int) or not isinstance(hidden, int) or n <= 0:
        raise ShapeError(f"{what} {x} must have concrete stream and hidden dims")
    return tokens, n, hidden


def _require_f32(t: TensorType, shape: tuple[Dim, ...], what: str) -> None:
    R.require_dtype(t, ("f32",), what)
    if t.shape != shape:
        raise ShapeError(f"{what} is {t}, expected shape {shape}")


@params
class HcPreParams:
    sinkhorn_iters: int
    eps: float
    norm_eps: float


def _hc_pre_rule(p: HcPreParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    x, fn, base, scale = ts
    if not isinstance(p.sinkhorn_iters, int) or p.sinkhorn_iters < 1:
        raise ShapeError(f"sinkhorn_iters is {p.sinkhorn_iters}, expected an int >= 1")
    tokens, n, hidden = _streams(x, "x")
    mixes = 2 * n + n * n
    _require_f32(fn, (mixes, n * hidden), "fn")
    _require_f32(base, (mixes,), "base")
    _require_f32(scale, (3,), "scale")
    return (
        TensorType((tokens, n), "f32"),
        TensorType((tokens, n), "f32"),
        TensorType((tokens, n, n), "f32"),
    )


hc_pre = declare_op(
    "hc_pre",
    HcPreParams,
    _hc_pre_rule,
    "`x [tokens, n, H] float, fn [2n+n*n, n*H] f32, base [2n+n*n] f32, scale [3] f32` -> "
    "`(pre [tokens, n] f32, post [tokens, n] f32, comb [tokens, n, n] f32)`, all in f32: v = flatten(x); "
    "mix = (fn . v) * rsqrt(mean(v^2) + norm_eps) (projection first); "
    "z = base + mix * [scale0 x n, scale1 x n, "
    "scale2 x n*n] (one fused multiply-add); pre = sigmoid(z[:n]) + eps; post = 2*sigmoid(z[n:2n]); "
    "comb = z[2n:] as [n, n] (row i = input stream): softmax over each row + eps, "
    "divide by (column sums + eps), "
    "then sinkhorn_iters-1 rounds of dividing by (row sums + eps) then by (column sums + eps).",
    num_inputs=4,
)


@params
class HcCollapseParams:
    out_dtype: str = "f32"


def _hc_collapse_rule(p: HcCollapseParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    x, a = ts
    tokens, n, hidden = _streams(x, "x")
    _require_f32(a, (tokens, n), "a")
    if p.out_dtype not in ("f32", "bf16", "f16"):
        raise ShapeError(f"out_dtype {p.out_dtype!r} is not one of ['f32', 'bf16', 'f16']")
    return (TensorType((tokens, hidden), p.out_dtype),)


hc_collapse = declare_op(
    "hc_collapse",
    HcCollapseParams,
    _hc_collapse_rule,
    "`x [tokens, n, H] float, a [tokens, n] f32` -> `[tokens, H] out_dtype`: "
    "sum_i a_i * x_i in f32, cast once.",
    num_inputs=2,
)


def _hc_expand_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    y, x, post, comb = ts
    tokens, n, hidden = _streams(x, "x")
    R.require_float(y, "y")
    if y.shape != (tokens, hidden):
        raise ShapeError(f"y is {y}, expected shape {(tokens, hidden)} (x is {x})")
    _require_f32(post, (tokens, n), "post")
    _require_f32(comb, (tokens, n, n), "comb")
    return (x,)


hc_expand = declare_op(
    "hc_expand",
    NoParams,
    _hc_expand_rule,
    "`y [tokens, H] float, x [tokens, n, H] float, post [tokens, n] f32, comb [tokens, n, n] f32` -> "
    "`[tokens, n, H]` dtype of x: x'_j = post_j * y + sum_i comb[i, j] * x_i, in f32, cast once.",
    num_inputs=4,
)
