"""Triton device functions for V4.1's quantization rounding points, bit-equal to platform/cpu/quant.py.

- `pow2_scale`: `2^ceil(log2(max(amax, floor) * fl32(1/qmax)))` from the FP32 bits, and its exact reciprocal
  (also from the bits: a divide would be an approximate `div.full.f32` on the GPU);
- `e4m3_grid`: FP32 -> the nearest E4M3 value (clamp +-448, round to nearest even) still in FP32. The
  rounding is done here on the bits instead of by the FP32 -> FP8 cast because Triton 3.6's interpreter
  cast drops the carry into the exponent (it turns 31.69 into 16, not 32); the GPU cast of an FP32 that
  is already on the grid is exact, so both give the same byte;
- `e8m0_to_f32`: a UE8M0 byte -> 2^(e-127) (byte 0 is the FP32 subnormal 2^-127, 255 is NaN, like torch);
- `fp8_g32_quantize`: one 32-column group of activation rows -> (E4M3 values, power-of-two scales);
- `e2m1_to_e4m3`: 4-bit E2M1 codes -> the E4M3 byte of the same value (every E2M1 value is one), so FP4
  weights run on the FP8 tensor cores (Hopper has no FP4 ones); code 8 (-0) becomes +0 like the cpu
  checkpoint dequantizer;
- `round_f32_to`: FP32 -> bf16/f16/f32 rounded to nearest even. The bf16 rounding is done on the bits
  because the interpreter's FP32 -> bf16 cast truncates; the GPU cast of the rounded value is exact;
- `silu_f32`: silu evaluated in f64 and rounded once to FP32, like platform/cpu/invariant.silu.

Importing this module imports triton; the rule modules import it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl

E4M3_MAX = 448.0
FP8_AMAX_FLOOR = 1e-4


@triton.jit
def e8m0_to_f32(e: tl.tensor) -> tl.tensor:
    """UE8M0 byte -> 2^(e-127) in f32 (byte 0 is the subnormal 2^-127, 255 is NaN, as torch decodes)."""
    e = e.to(tl.int32)
    bits = tl.where(e == 0, 0x00400000, tl.where(e == 255, 0x7FC00000, e << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def pow2_scale(amax: tl.tensor, floor: tl.constexpr, inv_qmax: tl.constexpr) -> tuple[tl.tensor, tl.tensor]:
    """(scale, 1 / scale) in FP32; `inv_qmax` is fl32(1/qmax) as the caller spells it (a Python float
    that Triton rounds to FP32 once, as torch does with its FP32 tensor)."""
    t = tl.maximum(amax, floor, propagate_nan=tl.PropagateNan.ALL) * inv_qmax
    bits = t.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    scale = (exponent << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - exponent) << 23).to(tl.float32, bitcast=True)
    return scale, inverse


@triton.jit
def e4m3_grid(v: tl.tensor) -> tl.tensor:
    """FP32 -> the E4M3 value nearest to it (ties to even, clamped to +-448), as FP32 with v's sign bit."""
    a = tl.minimum(tl.abs(v), 448.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN (torch.clamp)
    bits = a.to(tl.int32, bitcast=True)
    # Normal E4M3 (|v| >= 2^-6): keep 3 mantissa bits; adding 0x7FFFF plus the kept lsb rounds to nearest
    # even, and a carry out of the mantissa moves into the exponent as it should.
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & ~0xFFFFF).to(tl.float32, bitcast=True)
    # Subnormal E4M3 (|v| < 2^-6): multiples of 2^-9. a * 512 < 8, so adding 2^23 rounds it to an integer
    # (FP32 addition rounds to nearest even) and subtracting gives it back exactly.
    sub = ((a * 512.0 + 8388608.0) - 8388608.0) * 0.001953125
    r = tl.where(a >= 0.015625, normal, sub)
    sign = v.to(tl.int32, bitcast=True) & -2147483648
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def amax_rows(x: tl.tensor) -> tl.tensor:
    """max |x| along axis 1, NaN when a row holds one (torch.amax; the GPU's max drops a NaN)."""
    return tl.reduce(tl.abs(x), 1, _max_nan)


@triton.jit
def fp8_g32_grid(x: tl.tensor) -> tuple[tl.tensor, tl.tensor]:
    """x [BM, 32] FP32 (one group per row) -> (the E4M3 values as FP32 [BM, 32], FP32 power-of-two scales
    [BM]), as the cpu codec (quant.fp8_g32_quantize) for every input. The cpu codec divides by the scale;
    multiplying by the scale's IEEE reciprocal gives the same values, also for the scales of non-finite
    groups (pow2_scale's bits: -0 for a group holding a NaN, +inf for one holding an infinity), whose
    reciprocals are -inf and +0 (pow2_scale's exponent arithmetic gives others there). A qdq multiplies
    these values by the scale; they are exact E4M3 values, NaN where the codec gives NaN."""
    scale, inverse = pow2_scale(amax_rows(x), 1e-4, 0.002232142857142857)
    inverse = tl.where(scale == 0.0, -float("inf"), tl.where(scale == float("inf"), 0.0, inverse))
    return e4m3_grid(x * inverse[:, None]), scale


@triton.jit
def fp8_g32_quantize(x: tl.tensor) -> tuple[tl.tensor, tl.tensor]:
    """x [BM, 32] FP32 -> (E4M3 [BM, 32], FP32 power-of-two scales [BM]): fp8_g32_grid's values stored.
    A NaN is written as E4M3's NaN byte (Triton's interpreter converts a NaN to 384; the sign of a NaN is
    the platform's, torch's x86 division gives -NaN, so tests compare NaN-ness only)."""
    r, scale = fp8_g32_grid(x)
    nan = tl.full(r.shape, 0x7F, tl.uint8).to(tl.float8e4nv, bitcast=True)
    return tl.where(r != r, nan, r.to(tl.float8e4nv)), scale


@triton.jit
def fp8_g32_quantize_kernel(
    x_ptr, q_ptr, s_ptr, num_rows, width, BLOCK_M: tl.constexpr, PDL: tl.constexpr = False
) -> None:
    """Test entry: quantize a [num_rows, width] FP32 matrix in 32-column groups (grid: row blocks, groups)."""
    pdl_tl.enter(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * 32 + tl.arange(0, 32)
    mask = rows[:, None] < num_rows
    x = tl.load(x_ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)
    q, scale = fp8_g32_quantize(x)
    tl.store(q_ptr + rows[:, None] * width + cols[None, :], q, mask=mask)
    tl.store(s_ptr + rows * (width // 32) + tl.program_id(1), scale, mask=rows < num_rows)


@triton.jit
def e2m1_to_e4m3(codes: tl.tensor) -> tl.tensor:
    """int32 codes 0..15 (bit 3 the sign) -> float8e4nv: exponent field e2 + 6, mantissa bit moved up 2."""
    magnitude = codes & 7
    e2 = magnitude >> 1
    normal = ((e2 + 6) << 3) | ((magnitude & 1) << 2)
    byte = tl.where(magnitude >= 2, normal, tl.where(magnitude == 1, 0x30, 0))
    byte = byte | tl.where(magnitude != 0, (codes & 8) << 4, 0)
    return byte.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def round_f32_to(x: tl.tensor, dtype: tl.constexpr) -> tl.tensor:
    """FP32 -> dtype, round to nearest even (bf16 on the bits; NaN kept as is)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
        out = tl.where(x != x, x, rounded).to(tl.bfloat16)
    else:
        out = x.to(dtype)
    return out


@triton.jit
def silu_f32(x: tl.tensor) -> tl.tensor:
    xd = x.to(tl.float64)
    return (xd / (1.0 + tl.exp(-xd))).to(tl.float32)


@triton.jit
def swiglu_f32(g, v, limit) -> tl.tensor:
    """silu(min(g, limit)) * clamp(v, -limit, limit) in f32, NaN kept as torch.clamp keeps it
    (platform/cpu/rules_moe.swiglu_f32): the GPU's min and max return the other operand for a NaN."""
    nan: tl.constexpr = tl.PropagateNan.ALL
    v = tl.minimum(tl.maximum(v, -limit, propagate_nan=nan), limit, propagate_nan=nan)
    return silu_f32(tl.minimum(g, limit, propagate_nan=nan)) * v


# Four E2M1 bytes ($4) and each byte's scale as a BF16x2 pair ($5..$8, byte i's in $5+i) -> per byte i
# the BF16x2 register $i of (low nibble's value, high nibble's value), the pair of consecutive columns the
# dot's operand register holds, so nothing repacks them. Which 32-code group a packed byte belongs to
# depends on the register layout Triton picks, so every byte takes its own scale. The word shifted by 4
# holds each byte's low nibble where the plain byte holds its high one (bits 4..7): one PRMT takes byte i
# shifted into the low half and plain into the high half, and a mask, one multiply (by 0x104: two copies
# of each masked nibble, magnitude at bits 6..8 and sign at 15 of its half) and a mask form two BF16s of
# value x 2^-126 exactly (magnitudes 0 and 1 on BF16's subnormals). Then x 2^126 and x the byte's scale pair;
# ONE (MXFP4 scales of at most 2^1, moe_swap_tl): the pair is 2^(s-1) and one multiply does both.
def e2m1_pairs_asm(one: bool) -> str:
    """The PTX of E2M1_PAIRS_ASM (E2M1_PAIRS_ASM_ONE with one): a shift, then 5 (one) or 6 instructions
    per byte."""
    lines = ["{", ".reg .b32 u, t, c;", "mov.b32 c, 0x7E807E80;", "shl.b32 u, $4, 4;"]
    for i in range(4):
        lines += [f"prmt.b32 t, u, $4, 0x{4 + i}{4 + i}{i}{i};", "and.b32 t, t, 0x00F000F0;"]
        lines += ["mul.lo.u32 t, t, 0x104;", "and.b32 t, t, 0x81C081C0;"]
        lines += [] if one else ["mul.rn.bf16x2 t, t, c;"]
        lines += [f"mul.rn.bf16x2 ${i}, t, ${5 + i};"]
    return "\n".join([*lines, "}"])


E2M1_PAIRS_ASM = tl.constexpr(e2m1_pairs_asm(False))
E2M1_PAIRS_ASM_ONE = tl.constexpr(e2m1_pairs_asm(True))


@triton.jit
def bf16_halves(words: tl.tensor) -> tuple[tl.tensor, tl.tensor]:
    """E2M1_PAIRS_ASM's int32 words -> (low halves, high halves) as BF16: the low and the high nibble's
    value of each byte."""
    low = (words & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
    high = (words >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return low, high
