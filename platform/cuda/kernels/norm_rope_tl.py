"""Triton kernels of `rms_norm` and `rope` (norm_rope.py holds the rules).

rms_norm: one program per row, the sum of squares in fixed BLOCK tiles (batch invariant), then the cpu
rule's arithmetic: mean = sum / D, rsqrt as 1/sqrt with IEEE sqrt and division, x * r, w * that, one
cast. rope: one program per (token, block of heads); angle = f32(position) * freq (the freq table comes
from the cpu helper), cos and sin evaluated in f64 and rounded once to f32 (the correctly rounded values,
which the C library's cosf/sinf that the cpu rule calls give nearly always), then the rotation with
each product rounded before the sum. The rules launch with fp-fusion off so no product is fused.

Importing this module imports triton; norm_rope.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels.quant_tl import round_f32_to


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, eps, D: tl.constexpr, BLOCK: tl.constexpr, OUT: tl.constexpr):
    """Grid (rows,): out[r] = w * (x[r] * 1/sqrt(mean(x[r]^2) + eps)), cast to OUT."""
    row = tl.program_id(0).to(tl.int64) * D
    c = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in tl.static_range(0, D, BLOCK):
        x = tl.load(x_ptr + row + c0 + c, mask=c0 + c < D, other=0.0).to(tl.float32)
        acc += x * x
    ms = tl.math.div_rn(tl.sum(acc, axis=0), tl.full((), D, tl.float32)) + eps
    r = tl.math.div_rn(1.0, tl.math.sqrt_rn(ms))
    for c0 in tl.static_range(0, D, BLOCK):
        mask = c0 + c < D
        x = tl.load(x_ptr + row + c0 + c, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c0 + c, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row + c0 + c, round_f32_to(w * (x * r), OUT), mask=mask)


@triton.jit
def rope_kernel(
    x_ptr, pos_ptr, freq_ptr, out_ptr, heads,
    D: tl.constexpr, ROPE: tl.constexpr, INVERSE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """Grid (tokens, cdiv(heads, BLOCK_H)): x [tokens, heads, D]; the last ROPE columns rotate in pairs."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    base = (t * heads + h.to(tl.int64)) * D
    c = tl.arange(0, BLOCK_D)
    keep = (h[:, None] < heads) & (c[None, :] < D - ROPE)
    x = tl.load(x_ptr + base[:, None] + c[None, :], mask=keep, other=0.0)
    tl.store(out_ptr + base[:, None] + c[None, :], x, mask=keep)
    j = tl.arange(0, BLOCK_P)
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(freq_ptr + j, mask=j < ROPE // 2, other=0.0)
    cos = tl.cos(angle.to(tl.float64)).to(tl.float32)
    sin = tl.sin(angle.to(tl.float64)).to(tl.float32)
    if INVERSE:
        sin = sin * -1.0  # not -sin: Triton negates as 0 - x, which loses the sign of -0
    pairs = (h[:, None] < heads) & (j[None, :] < ROPE // 2)
    even = base[:, None] + (D - ROPE) + 2 * j[None, :]
    x0 = tl.load(x_ptr + even, mask=pairs, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + even + 1, mask=pairs, other=0.0).to(tl.float32)
    real = x0 * cos[None, :] - x1 * sin[None, :]
    imag = x0 * sin[None, :] + x1 * cos[None, :]
    tl.store(out_ptr + even, round_f32_to(real, OUT), mask=pairs)
    tl.store(out_ptr + even + 1, round_f32_to(imag, OUT), mask=pairs)
