"""Batch-invariant float math for the cpu rules: a value never depends on the size of its tensor or
on where it sits in it.

torch's vectorized cpu kernels compute some functions (sigmoid, silu, softplus, pow, softmax over a
non-last dim, complex multiply) one way on the vector body and another way on the tail or at thread
split points, so the last f32 bit of a token's value changes with the number of tokens in the step.
The helpers here evaluate in f64 and round once to f32: both of torch's paths are then accurate to a
few f64 ulps (~1e-16 relative), far below f32's resolution (6e-8), and round to the same f32 unless the
exact value lies within ~1e-16 of an f32 rounding midpoint. A side effect is that the results are the
correctly rounded f32 values (almost always), which can differ by 1 ulp from an oracle that computes
in f32. Products of two f32 values are exact in f64, so short dot products (the RoPE rotation) are too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["cos_sin", "exp", "in_f64", "log", "rotate_pairs", "sigmoid", "silu", "softmax", "softplus"]


def in_f64(fn: Callable[..., Tensor], *xs: Tensor) -> Tensor:
    """`fn` of the operands evaluated in f64, rounded once to an f32 result."""
    return fn(*(x.double() for x in xs)).float()


def exp(x: Tensor) -> Tensor:
    return in_f64(torch.exp, x)


def log(x: Tensor) -> Tensor:
    return in_f64(torch.log, x)


def sigmoid(x: Tensor) -> Tensor:
    return in_f64(torch.sigmoid, x)


def silu(x: Tensor) -> Tensor:
    return in_f64(F.silu, x)


def softplus(x: Tensor) -> Tensor:
    return in_f64(F.softplus, x)


def softmax(x: Tensor, dim: int) -> Tensor:
    """f32 softmax along `dim`; a row of only -inf gives NaN, as torch.softmax does."""
    return in_f64(lambda t: torch.softmax(t, dim=dim), x)


def cos_sin(angles: Tensor) -> tuple[Tensor, Tensor]:
    """(cos, sin) of f32 angles, each rounded once to f32."""
    wide = angles.double()
    return torch.cos(wide).float(), torch.sin(wide).float()


def rotate_pairs(x0: Tensor, x1: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """(x0 cos - x1 sin, x0 sin + x1 cos) of f32 operands; exact products, one rounding per result."""
    a, b, c, s = x0.double(), x1.double(), cos.double(), sin.double()
    return (a * c - b * s).float(), (a * s + b * c).float()
