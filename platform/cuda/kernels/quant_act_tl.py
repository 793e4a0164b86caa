"""Triton kernels of `act_qdq` and `cache_encode` (quant_act.py holds the rules), bit-equal to
platform/cpu/quant.py and cache_format.py.

FMT (constexpr): 0 fp8_g32, 1 mxfp4_g32, 2 nvfp4_g16 (divide), 3 nvfp4_g16_recip (reciprocal). A program
handles BLOCK_G groups of one row. FP8-g32 is quant_tl.fp8_g32_quantize, the codec every kernel shares.
Power-of-two scales come from quant_tl.pow2_scale (division by them is the exact multiply by their
reciprocal); NVFP4's E4M3 scale from quant_tl.e4m3_grid, its divide and
reciprocal with div_rn (IEEE, as torch). E2M1 codes: clamp to 6, count the midpoints strictly below,
an exact midpoint goes to the even code, sign bit 3 (quant.e2m1_codes). Encoding packs even columns in
the low nibble, so the FP4 kernels load even and odd columns as two tiles.

Importing this module imports triton; quant_act.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_tl import (
    e4m3_grid,
    fp8_g32_grid,
    fp8_g32_quantize,
    pow2_scale,
    round_f32_to,
)


@triton.jit
def _e2m1_code(v: tl.tensor) -> tl.tensor:
    m = tl.minimum(tl.abs(v), 6.0)
    lower = (
        (m > 0.25).to(tl.int32) + (m > 0.75).to(tl.int32) + (m > 1.25).to(tl.int32) + (m > 1.75).to(tl.int32)
        + (m > 2.5).to(tl.int32) + (m > 3.5).to(tl.int32) + (m > 5.0).to(tl.int32)
    )  # fmt: skip
    tie = (m == 0.25) | (m == 0.75) | (m == 1.25) | (m == 1.75) | (m == 2.5) | (m == 3.5) | (m == 5.0)
    code = lower + (tie & (lower % 2 == 1)).to(tl.int32)
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    return code | (sign << 3)


@triton.jit
def _e2m1_value(code: tl.tensor) -> tl.tensor:
    """Codes -> FP32 values, code 8 is -0 (quant.e2m1_values, signed zero)."""
    mag = code & 7
    value = tl.where(mag < 4, mag.to(tl.float32) * 0.5, tl.where(mag == 4, 2.0, tl.where(mag == 5, 3.0, 0.0)))
    value = tl.where(mag == 6, 4.0, tl.where(mag == 7, 6.0, value))
    # The sign as a bit (a float negation is 0 - x in Triton, which turns -0 into +0).
    return (value.to(tl.int32, bitcast=True) | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _group_scale(amax: tl.tensor, FMT: tl.constexpr) -> tuple[tl.tensor, tl.tensor]:
    """(scale, the factor values are multiplied by) per FP4 group (FMT 1-3); for FMT 2 the factor is unused
    (divide)."""
    if FMT == 1:
        scale, factor = pow2_scale(amax, 6 * 2.0**-126, 0.16666666666666666)
    elif FMT == 2:
        scale = e4m3_grid(tl.math.div_rn(tl.maximum(amax, 6 * 2.0**-9), tl.full(amax.shape, 6.0, tl.float32)))
        factor = scale
    else:
        scale = e4m3_grid(tl.maximum(amax, 6 * 2.0**-9) * 0.16666666666666666)
        factor = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), scale)
    return scale, factor


@triton.jit
def _normalize(x: tl.tensor, scale: tl.tensor, factor: tl.tensor, FMT: tl.constexpr) -> tl.tensor:
    if FMT == 2:
        out = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    else:
        out = x * factor[:, None]
    return out


@triton.jit
def qdq_kernel(
    x_ptr, out_ptr, D: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    OUT: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (rows, cdiv(D / GROUP, BLOCK_G)): out = dequantize(quantize(x)) in FP32, cast once to OUT."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64) * D
    g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = g[:, None] < D // GROUP
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row + cols, round_f32_to(qdq_groups(x, FMT), OUT), mask=mask)


@triton.jit
def qdq_groups(x: tl.tensor, FMT: tl.constexpr) -> tl.tensor:
    """x [G, GROUP] FP32, one group per row -> dequantize(quantize(x)) in FP32 (act_qdq's values)."""
    if FMT == 0:  # the one FP8-g32 codec (non-finite groups as the cpu codec's too)
        values, scale = fp8_g32_grid(x)
    else:
        scale, factor = _group_scale(tl.max(tl.abs(x), axis=1), FMT)
        values = _e2m1_value(_e2m1_code(_normalize(x, scale, factor, FMT)))
    return values * scale[:, None]


@triton.jit
def qdq_tile(y: tl.tensor, FMT: tl.constexpr, GROUP: tl.constexpr, OUT: tl.constexpr) -> tl.tensor:
    """A fused op's quantization of its result tile (ops/fused.py): y [R, C] FP32, every run of GROUP
    columns from column 0 one group (C a multiple of GROUP) -> act_qdq's values in OUT, [R, C]."""
    R: tl.constexpr = y.shape[0]
    C: tl.constexpr = y.shape[1]
    q = qdq_groups(tl.reshape(y, (R * C // GROUP, GROUP)), FMT)
    return tl.reshape(round_f32_to(q, OUT), (R, C))


@triton.jit
def encode_kernel(
    x_ptr, out_ptr, D: tl.constexpr, ENTRY: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (rows, cdiv(D / GROUP, BLOCK_G)): x [rows, D] -> entries [rows, ENTRY] uint8 (cache_format)."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    encode_groups(x_ptr + row * D, out_ptr + row * ENTRY, g, g < D // GROUP, D, FMT, GROUP)


@triton.jit
def encode_groups(x_row, out_row, g, inside, D: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr) -> None:
    """Groups g (those `inside` only) of the row at x_row [D] -> their bytes in the entry at out_row:
    the values first, then one scale byte per group (cache_format's layout)."""
    if FMT == 0:
        cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        x = tl.load(x_row + cols, mask=inside[:, None], other=0.0).to(tl.float32)
        q, scale = fp8_g32_quantize(x)
        tl.store(out_row + cols, q.to(tl.uint8, bitcast=True), mask=inside[:, None])
        byte = ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)
        tl.store(out_row + D + g, byte, mask=inside)
    else:
        half = g[:, None] * (GROUP // 2) + tl.arange(0, GROUP // 2)[None, :]
        x0 = tl.load(x_row + 2 * half, mask=inside[:, None], other=0.0).to(tl.float32)
        x1 = tl.load(x_row + 2 * half + 1, mask=inside[:, None], other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x0), axis=1), tl.max(tl.abs(x1), axis=1))
        scale, factor = _group_scale(amax, FMT)
        c0 = _e2m1_code(_normalize(x0, scale, factor, FMT))
        c1 = _e2m1_code(_normalize(x1, scale, factor, FMT))
        tl.store(out_row + half, (c0 | (c1 << 4)).to(tl.uint8), mask=inside[:, None])
        if FMT == 1:
            byte = ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)
        else:
            byte = scale.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        tl.store(out_row + D // 2 + g, byte, mask=inside)
