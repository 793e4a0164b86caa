"""Triton kernels of `rms_norm` and `rope` (norm_rope.py holds the rules).

rms_norm: one program per row, the sum of squares in fixed BLOCK tiles (batch invariant), then the cpu
rule's arithmetic: mean = sum / D, rsqrt as 1/sqrt with IEEE sqrt and division, x * r, w * that, one
cast. rope: one program per (token, block of heads); angle = f32(position) * freq (the freq table comes
from the cpu helper), cos and sin evaluated in f64 and rounded once to f32 (the correctly rounded values,
which the C library's cosf/sinf that the cpu rule calls give nearly always), then the rotation with
each product rounded before the sum. The rules launch with fp-fusion off so no product is fused.

norm_rope (the fused `rms_norm_rope`): one program per row runs both, the rope reading the norm's rounded
outputs from registers.

Importing this module imports triton; norm_rope.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_act_tl import qdq_tile
from dsgraph.platform.cuda.kernels.quant_tl import round_f32_to


@triton.jit
def _norm_input(x_ptr, a_ptr, t, cols, mask, D: tl.constexpr, N: tl.constexpr, OUT: tl.constexpr):
    """Row t of the norm's input at `cols`, in f32: x[t] (N == 0), or (hc_collapse_norm) the collapse
    of the N streams x[t] [N, D] by a[t] [N], as mhc_tl.hc_collapse_kernel computes and rounds it."""
    if N == 0:
        v = tl.load(x_ptr + t * D + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros(cols.shape, dtype=tl.float32)
        for i in tl.static_range(N):
            a = tl.load(a_ptr + t * N + i)
            x = tl.load(x_ptr + (t * N + i) * D + cols, mask=mask, other=0.0).to(tl.float32)
            acc = acc + a * x
        v = round_f32_to(acc, OUT).to(tl.float32)
    return v


@triton.jit
def inv_rms(x_ptr, a_ptr, t, eps, D: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr, OUT: tl.constexpr):
    """1 / sqrt(mean(x[t]^2) + eps) of row t: squares summed in BLOCK tiles, then one tree sum."""
    c = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in tl.static_range(0, D, BLOCK):
        x = _norm_input(x_ptr, a_ptr, t, c0 + c, c0 + c < D, D, N, OUT)
        acc += x * x
    ms = tl.math.div_rn(tl.sum(acc, axis=0), tl.full((), D, tl.float32)) + eps
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(ms))


@triton.jit
def rms_norm_kernel(
    x_ptr, a_ptr, w_ptr, out_ptr, q_ptr, eps, D: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr,
    OUT: tl.constexpr, RAW: tl.constexpr, QDQ: tl.constexpr, GROUP: tl.constexpr, QOUT: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (rows,): out[r] = w * (x[r] * 1/sqrt(mean(x[r]^2) + eps)), cast to OUT (stored when RAW),
    x[r] the row or (N > 0) the collapse of its N streams (`_norm_input`, recomputed in the second pass:
    the same bits). QDQ >= 0 (the `_qdq` ops): q[r] = act_qdq of the output, format QDQ (quant_act_tl),
    cast to QOUT."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    r = inv_rms(x_ptr, a_ptr, t, eps, D, N, BLOCK, OUT)
    for c0 in tl.static_range(0, D, BLOCK):
        mask = c0 + c < D
        x = _norm_input(x_ptr, a_ptr, t, c0 + c, mask, D, N, OUT)
        w = tl.load(w_ptr + c0 + c, mask=mask, other=0.0).to(tl.float32)
        y = round_f32_to(w * (x * r), OUT)
        if RAW:
            tl.store(out_ptr + t * D + c0 + c, y, mask=mask)
        if QDQ >= 0:
            q = qdq_tile(tl.reshape(y.to(tl.float32), (1, BLOCK)), QDQ, GROUP, QOUT)
            tl.store(q_ptr + t * D + c0 + c, tl.reshape(q, (BLOCK,)), mask=mask)


@triton.jit
def rope_kernel(
    x_ptr, pos_ptr, freq_ptr, out_ptr, q_ptr, heads,
    D: tl.constexpr, ROPE: tl.constexpr, INVERSE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, OUT: tl.constexpr,
    RAW: tl.constexpr, QDQ: tl.constexpr, GROUP: tl.constexpr, QOUT: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (tokens, cdiv(heads, BLOCK_H)): x [tokens, heads, D]; the last ROPE columns rotate in pairs;
    stored when RAW. QDQ >= 0 (rope_qdq): q = act_qdq of the result per head row, format QDQ, cast to
    QOUT; D - ROPE and ROPE are multiples of GROUP then, and BLOCK_P is ROPE / 2 or a multiple of
    GROUP / 2 (no group mixes the two parts, or a pair past ROPE with one before it)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    base = (t * heads + h.to(tl.int64)) * D
    if D > ROPE:
        c = tl.arange(0, BLOCK_D)
        keep = (h[:, None] < heads) & (c[None, :] < D - ROPE)
        x = tl.load(x_ptr + base[:, None] + c[None, :], mask=keep, other=0.0)
        if RAW:
            tl.store(out_ptr + base[:, None] + c[None, :], x, mask=keep)
        if QDQ >= 0:
            q = qdq_tile(x.to(tl.float32), QDQ, GROUP, QOUT)
            tl.store(q_ptr + base[:, None] + c[None, :], q, mask=keep)
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
    real = round_f32_to(x0 * cos[None, :] - x1 * sin[None, :], OUT)
    imag = round_f32_to(x0 * sin[None, :] + x1 * cos[None, :], OUT)
    if RAW:
        tl.store(out_ptr + even, real, mask=pairs)
        tl.store(out_ptr + even + 1, imag, mask=pairs)
    if QDQ >= 0:
        # the pairs interleaved back into column order (2j, 2j + 1), quantized, and split again
        y = tl.reshape(tl.join(real.to(tl.float32), imag.to(tl.float32)), (BLOCK_H, 2 * BLOCK_P))
        q0, q1 = tl.split(tl.reshape(qdq_tile(y, QDQ, GROUP, QOUT), (BLOCK_H, BLOCK_P, 2)))
        tl.store(q_ptr + even, q0, mask=pairs)
        tl.store(q_ptr + even + 1, q1, mask=pairs)


@triton.jit
def normed(x_ptr, w_ptr, offs, cols, mask, r, OUT: tl.constexpr) -> tl.tensor:
    """rms_norm_kernel's output at row offsets `offs` (weight columns `cols`), as stored then read back."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return round_f32_to(w * (x * r), OUT).to(tl.float32)


@triton.jit
def norm_rope_kernel(
    x_ptr, w_ptr, pos_ptr, freq_ptr, out_ptr, q_ptr, eps, heads,
    D: tl.constexpr, ROPE: tl.constexpr, INVERSE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
    OUT: tl.constexpr, RAW: tl.constexpr, QDQ: tl.constexpr, GROUP: tl.constexpr, QOUT: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (rows,), a row = one head of a token (token = row // heads): rms_norm_kernel's factor and
    output, then rope_kernel's rotation of the last ROPE columns, whose inputs are the norm's outputs as
    rms_norm_kernel stores them (the same arithmetic, so the bits of the two launches, with no round
    trip through memory). Stored when RAW; QDQ >= 0 quantizes as rope_kernel does (the passed-through
    and the rotated columns apart)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    r = inv_rms(x_ptr, x_ptr, t, eps, D, 0, BLOCK, OUT)
    c = tl.arange(0, BLOCK)
    for c0 in tl.static_range(0, D - ROPE, BLOCK):
        mask = c0 + c < D - ROPE
        y = normed(x_ptr, w_ptr, t * D + c0 + c, c0 + c, mask, r, OUT)
        if RAW:
            tl.store(out_ptr + t * D + c0 + c, y.to(OUT), mask=mask)
        if QDQ >= 0:
            q = qdq_tile(tl.reshape(y, (1, BLOCK)), QDQ, GROUP, QOUT)
            tl.store(q_ptr + t * D + c0 + c, tl.reshape(q, (BLOCK,)), mask=mask)
    j = tl.arange(0, BLOCK_P)[None, :]
    pairs = j < ROPE // 2
    angle = tl.load(pos_ptr + t // heads).to(tl.float32) * tl.load(freq_ptr + j, mask=pairs, other=0.0)
    cos = tl.cos(angle.to(tl.float64)).to(tl.float32)
    sin = tl.sin(angle.to(tl.float64)).to(tl.float32)
    if INVERSE:
        sin = sin * -1.0  # not -sin: Triton negates as 0 - x, which loses the sign of -0
    cols = (D - ROPE) + 2 * j
    x0 = normed(x_ptr, w_ptr, t * D + cols, cols, pairs, r, OUT)
    x1 = normed(x_ptr, w_ptr, t * D + cols + 1, cols + 1, pairs, r, OUT)
    real = round_f32_to(x0 * cos - x1 * sin, OUT)
    imag = round_f32_to(x0 * sin + x1 * cos, OUT)
    if RAW:
        tl.store(out_ptr + t * D + cols, real, mask=pairs)
        tl.store(out_ptr + t * D + cols + 1, imag, mask=pairs)
    if QDQ >= 0:
        y = tl.reshape(tl.join(real.to(tl.float32), imag.to(tl.float32)), (1, 2 * BLOCK_P))
        q0, q1 = tl.split(tl.reshape(qdq_tile(y, QDQ, GROUP, QOUT), (1, BLOCK_P, 2)))
        tl.store(q_ptr + t * D + cols, q0, mask=pairs)
        tl.store(q_ptr + t * D + cols + 1, q1, mask=pairs)
