"""Batch-invariant float math for the cpu rules: a value never depends on the size of its tensor, on
where it sits in it, or on the other rows of the step.

torch's cpu kernels compute some functions (sigmoid, silu, softplus, pow, softmax over a non-last dim,
complex multiply) one way on the vector body and another way on the scalar tail, and bmm picks and
blocks its GEMM kernel by the batch count, so the last f32 bit of a token's value changes with the
number of tokens in the step. Three cures, by function:

- transcendental functions and softmax are evaluated in f64 and rounded once to f32: both of torch's
  paths are then accurate to a few f64 ulps (~1e-16 relative), far below f32's resolution (6e-8), and
  round to the same f32 unless the exact value lies within ~1e-16 of an f32 rounding midpoint. The
  results are (almost always) the correctly rounded ones, which can differ by 1 ulp from an oracle that
  computes in f32;
- per-row matrix products are element-wise products summed by a last-dim reduction (`matmul`);
- the RoPE table and rotation keep the references' f32 rounding, computed by kernels that treat every
  element alike (`cos_sin`, `rotate_pairs`), so they stay bit-equal to NeMo where NeMo's own kernels
  take their vector path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "cos_sin",
    "exp",
    "fused_multiply_add",
    "in_f64",
    "log",
    "matmul",
    "rotate_pairs",
    "sigmoid",
    "silu",
    "softmax",
    "softplus",
]


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


def fused_multiply_add(base: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """`base + x * y` of f32 operands with the product exact, as one FMA rounds it (torch.addcmul is an
    FMA on the vector body, but whether its scalar tail is fused depends on how torch was compiled)."""
    return in_f64(torch.addcmul, base, x, y)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """`a [*, m, k] @ b [*, k, n]` (batch dims broadcast) in f32, each output on its own.

    torch.bmm picks its cpu kernel by the batch count and blocks over rows and batches, so an output's
    rounding depends on the other matrices of the call (seen for m > 1 and for distinct per-batch b).
    Here every output is its k f32 products summed by a last-dim reduction, whose order depends on k
    only. Memory is [*, m, n, k]: fine for the per-row attention products of the reference.
    """
    return (a.float().unsqueeze(-2) * b.float().transpose(-1, -2).unsqueeze(-3)).sum(-1)


def cos_sin(angles: Tensor) -> tuple[Tensor, Tensor]:
    """(cos, sin) of f32 angles in f32, as torch.polar computes them (the references' RoPE table).

    torch.polar has no vectorized cpu kernel: it calls the C library's cosf/sinf on every element, so
    its values do not depend on position (torch.cos/torch.sin are SLEEF kernels with other roundings)."""
    rotation = torch.polar(torch.ones_like(angles), angles)
    return rotation.real, rotation.imag


def rotate_pairs(x0: Tensor, x1: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """(x0 cos - x1 sin, x0 sin + x1 cos) in f32, each product rounded, then the sum: the rounding of
    torch's vectorized complex64 multiply (the references' rotation), on every element. torch's own
    complex multiply rounds its scalar tail differently, so it depends on the tensor's size."""
    return x0 * cos - x1 * sin, x0 * sin + x1 * cos
