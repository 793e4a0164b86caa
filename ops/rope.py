"""Rotary position embedding with V4.1's frequency-only YaRN correction (spec model-v41 3.2)."""

from __future__ import annotations

import math

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import TensorType
from dsgraph.ops import rules as R

__all__ = ["RopeParams", "rope", "yarn_bounds"]


@params
class RopeParams:
    rope_dim: int
    theta: float
    yarn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_max: int = 0
    inverse: bool = False


def yarn_bounds(
    rope_dim: int, theta: float, beta_fast: float, beta_slow: float, original_max: int
) -> tuple[int, int]:
    """(lo, hi) pair indices of the YaRN ramp: (15, 25) for the released config (64, 1.6e5, 32, 1, 65536).

    A pair whose wavelength fits beta times into `original_max` positions keeps its frequency (j <= lo);
    pairs past `hi` are fully interpolated. Computed in Python floats (double), as both references do.
    """

    def pair_index(beta: float) -> float:
        return rope_dim * math.log(original_max / (beta * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(pair_index(beta_fast)), 0)
    hi = min(math.ceil(pair_index(beta_slow)), rope_dim - 1)
    return lo, hi


def _check_params(p: RopeParams) -> None:
    if not isinstance(p.rope_dim, int) or p.rope_dim <= 0 or p.rope_dim % 2:
        raise ShapeError(f"rope_dim is {p.rope_dim}, expected a positive even int")
    if not p.theta > 1.0:
        raise ShapeError(f"theta is {p.theta}, expected > 1")
    if p.yarn_factor < 1.0:
        raise ShapeError(f"yarn_factor is {p.yarn_factor}, expected >= 1 (1 = no YaRN)")
    if p.yarn_factor > 1.0 and (p.original_max <= 0 or p.beta_fast <= 0 or p.beta_slow <= 0):
        raise ShapeError(
            f"YaRN (yarn_factor {p.yarn_factor}) needs original_max > 0 and positive betas, got "
            f"original_max={p.original_max}, beta_fast={p.beta_fast}, beta_slow={p.beta_slow}"
        )


def _rope_rule(p: RopeParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    x, positions = ts
    _check_params(p)
    R.require_float(x, "x")
    if x.rank < 2:
        raise ShapeError(f"x must be [tokens, *heads, d] (rank >= 2), got {x}")
    R.require_dtype(positions, ("i32",), "positions")
    R.require_rank(positions, 1, "positions")
    R.require_dim(positions.shape[0], x.shape[0], f"tokens of positions {positions} vs x {x}")
    width = x.shape[-1]
    if not isinstance(width, int) or width < p.rope_dim:
        raise ShapeError(f"last dim of x {x} is {width}, expected an int >= rope_dim {p.rope_dim}")
    return (x,)


rope = declare_op(
    "rope",
    RopeParams,
    _rope_rule,
    "`x [tokens, *heads, d] float, positions [tokens] i32` -> `[tokens, *heads, d]` dtype of x: the last "
    "rope_dim channels of every head, as adjacent pairs (2j, 2j+1) read as complex numbers, are multiplied "
    "by exp(i*pos*w_j) (inverse: exp(-i*pos*w_j)); the other channels pass through. "
    "w_j = 1/theta^(2j/rope_dim) "
    "in f32; with yarn_factor > 1, w_j <- (w_j/yarn_factor)*r_j + w_j*(1-r_j), r_j = clamp((j-lo)/max(hi-lo, "
    "1e-3), 0, 1), (lo, hi) = yarn_bounds(...) (no mscale). Angles pos*w_j in f32 from the integer "
    "positions; the rotation is an f32 complex multiply, cast once to x's dtype.",
    num_inputs=2,
)
