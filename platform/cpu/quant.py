"""Bit-exact quantization rules of V4.1 (spec model-v41 3.3, numerics-nemo-vs-deepinfer 2a-2c).

Scalar rules:
- power-of-two scale `2^ceil(log2(max(amax, floor) * fl32(1/qmax)))`, the ceiling taken from the FP32
  bits (a float log2 rounds wrongly near powers of two); the multiply by the FP32 reciprocal of qmax
  is the references' expression (for 448 and 6 it gives the exact ceiling of amax / qmax);
- E4M3: clamp to +-448, round to nearest even (torch's cast);
- E2M1: levels {0, .5, 1, 1.5, 2, 3, 4, 6}, clamp +-6, nearest level, an exact midpoint goes to the even
  3-bit code; the sign is a separate bit (code | 8), so -0 keeps its sign.

Activation/cache codecs (groups along the last dim): FP8-g32 (UE8M0 scale), MXFP4-g32 (UE8M0 scale),
NVFP4-g16 (E4M3 scale of max(amax, 6*2^-9)/6) with value mode `divide` (NeMo: x / sf) or `reciprocal`
(DeepInfer: x * fl32(1/sf), and its scale uses amax * fl32(1/6)). Each `*_qdq(x)` returns x's dtype and shape.

Weight codecs (checkpoint layouts, spec 8): FP8 E4M3 with UE8M0 block scales `scale[r // br, c // bc]`;
packed FP4 rows (int8, low nibble = even column) with 32-column UE8M0 scales; FP8 rows with 32-column
UE8M0 scales (Engram tables). Scales are `torch.float8_e8m0fnu` tensors, as stored on disk.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from dsgraph.platform.cpu.dtypes import constant

__all__ = [
    "E2M1_VALUES",
    "NvfpMode",
    "e2m1_codes",
    "e2m1_values",
    "e4m3_round",
    "e8m0_from_pow2",
    "e8m0_to_float",
    "fp4_dequantize",
    "fp4_rows_dequantize",
    "fp4_rows_quantize",
    "fp8_block_dequantize",
    "fp8_block_quantize",
    "fp8_g32_dequantize",
    "fp8_g32_qdq",
    "fp8_g32_quantize",
    "fp8_rows_dequantize",
    "fp8_rows_quantize",
    "mxfp4_g32_qdq",
    "mxfp4_g32_quantize",
    "nvfp4_g16_qdq",
    "nvfp4_g16_quantize",
    "pack_nibbles",
    "pow2_ceil",
    "pow2_scale",
    "unpack_nibbles",
]

NvfpMode = Literal["divide", "reciprocal"]

E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP8_AMAX_FLOOR = 1e-4
MXFP4_AMAX_FLOOR = 6 * 2**-126
NVFP4_AMAX_FLOOR = 6 * 2**-9
# Code -> value; bit 3 is the sign, so codes 8..15 are the negatives (8 is -0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_UNSIGNED = (*E2M1_VALUES[:8], 0.0, *E2M1_VALUES[9:])  # code 8 -> +0


def pow2_ceil(x: Tensor) -> Tensor:
    """Smallest power of two >= x for positive normal FP32 x, from the bits: exponent + (mantissa != 0)."""
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    round_up = ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((exponent + round_up) << 23).view(torch.float32)


def pow2_scale(amax: Tensor, floor: float, qmax: float) -> Tensor:
    """`pow2_ceil(max(amax, floor) * fl32(1/qmax))` in FP32."""
    reciprocal = torch.tensor(1.0 / qmax, dtype=torch.float32)  # 0-dim: a scalar on any device
    return pow2_ceil(amax.to(torch.float32).clamp_min(floor) * reciprocal)


def e8m0_from_pow2(scale: Tensor) -> Tensor:
    """The UE8M0 byte (biased exponent) of power-of-two FP32 scales, as `torch.float8_e8m0fnu`."""
    bits = scale.to(torch.float32).contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF).to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_to_float(scale: Tensor) -> Tensor:
    """UE8M0 bytes (`uint8` or `float8_e8m0fnu`) -> FP32 powers of two 2^(e-127)."""
    if scale.dtype == torch.uint8:
        scale = scale.view(torch.float8_e8m0fnu)
    if scale.dtype != torch.float8_e8m0fnu:
        raise TypeError(f"UE8M0 scale: dtype {scale.dtype}, expected uint8 or float8_e8m0fnu")
    return scale.to(torch.float32)


def e4m3_round(x: Tensor) -> Tensor:
    """FP32 -> E4M3 with clamp to +-448 and round-to-nearest-even."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e2m1_codes(x: Tensor) -> Tensor:
    """FP32 -> 4-bit E2M1 codes (uint8 0..15): clamp +-6, nearest level, midpoints to the even code."""
    magnitude = x.abs().clamp_max(E2M1_MAX).contiguous()
    midpoints = constant(_E2M1_MIDPOINTS, magnitude.dtype, magnitude.device)
    lower = torch.bucketize(magnitude, midpoints)  # number of midpoints strictly below: the lower level
    tie = magnitude == midpoints[lower.clamp_max(len(_E2M1_MIDPOINTS) - 1)]
    code = lower + (tie & (lower % 2 == 1)).to(lower.dtype)
    return (code | (torch.signbit(x).to(code.dtype) << 3)).to(torch.uint8)


def e2m1_values(codes: Tensor, signed_zero: bool = True) -> Tensor:
    """4-bit E2M1 codes -> FP32 values. Code 8 is -0, or +0 with `signed_zero=False`.

    The reference's checkpoint dequantizer decodes code 8 as +0 while its cache qdq keeps the sign;
    both are matched bit for bit.
    """
    table = constant(E2M1_VALUES if signed_zero else _E2M1_UNSIGNED, torch.float32, codes.device)
    return table[codes.long()]


def pack_nibbles(codes: Tensor) -> Tensor:
    """Codes [..., 2n] -> bytes [..., n] uint8, the even column in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles: last dim {codes.shape[-1]} is odd, expected an even width")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: Tensor) -> Tensor:
    """Bytes [..., n] (uint8 or int8) -> codes [..., 2n] uint8 (low nibble = even column)."""
    raw = packed.view(torch.uint8) if packed.dtype == torch.int8 else packed
    return torch.stack((raw & 0xF, raw >> 4), dim=-1).flatten(-2)


def _groups(x: Tensor, group: int, codec: str) -> Tensor:
    width = x.shape[-1] if x.dim() else 0
    if width == 0 or width % group:
        raise ValueError(f"{codec}: last dim {width} is not a positive multiple of the group size {group}")
    return x.to(torch.float32).unflatten(-1, (-1, group))


def fp8_g32_quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (E4M3 values [..., D] float8_e4m3fn, power-of-two FP32 scales [..., D/32])."""
    g = _groups(x, 32, "fp8_g32")
    scale = pow2_scale(g.abs().amax(-1, keepdim=True), FP8_AMAX_FLOOR, E4M3_MAX)
    return e4m3_round(g / scale).flatten(-2), scale.squeeze(-1)


def fp8_g32_dequantize(values: Tensor, scale: Tensor) -> Tensor:
    """(E4M3 [..., D], FP32 scales [..., D/32]) -> FP32 [..., D]."""
    return (values.to(torch.float32).unflatten(-1, (-1, 32)) * scale.unsqueeze(-1)).flatten(-2)


def fp8_g32_qdq(x: Tensor) -> Tensor:
    """SWA KV / activation FP8 boundary: group 32, UE8M0 scale (numerics 2a)."""
    return fp8_g32_dequantize(*fp8_g32_quantize(x)).to(x.dtype)


def mxfp4_g32_quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (E2M1 codes [..., D] uint8, power-of-two FP32 scales [..., D/32])."""
    g = _groups(x, 32, "mxfp4_g32")
    scale = pow2_scale(g.abs().amax(-1, keepdim=True), MXFP4_AMAX_FLOOR, E2M1_MAX)
    return e2m1_codes(g / scale).flatten(-2), scale.squeeze(-1)


def fp4_dequantize(codes: Tensor, scale: Tensor, group: int) -> Tensor:
    """(E2M1 codes [..., D], FP32 scales [..., D/group]) -> FP32 [..., D]."""
    return (e2m1_values(codes).unflatten(-1, (-1, group)) * scale.unsqueeze(-1)).flatten(-2)


def mxfp4_g32_qdq(x: Tensor) -> Tensor:
    """Index query/key MXFP4 boundary: group 32, UE8M0 scale (numerics 2b)."""
    return fp4_dequantize(*mxfp4_g32_quantize(x), 32).to(x.dtype)


def nvfp4_g16_quantize(x: Tensor, mode: NvfpMode = "divide") -> tuple[Tensor, Tensor]:
    """x [..., D] -> (E2M1 codes [..., D] uint8, E4M3-valued FP32 scales [..., D/16])."""
    g = _groups(x, 16, "nvfp4_g16")
    amax = g.abs().amax(-1, keepdim=True).clamp_min(NVFP4_AMAX_FLOOR)
    if mode == "divide":
        scale = e4m3_round(amax / E2M1_MAX).to(torch.float32)
        normalized = g / scale
    elif mode == "reciprocal":
        scale = e4m3_round(amax * torch.tensor(1 / E2M1_MAX, dtype=torch.float32)).to(torch.float32)
        normalized = g * (1.0 / scale)
    else:
        raise ValueError(f"nvfp4_g16: mode {mode!r} is not one of ('divide', 'reciprocal')")
    return e2m1_codes(normalized).flatten(-2), scale.squeeze(-1)


def nvfp4_g16_qdq(x: Tensor, mode: NvfpMode = "divide") -> Tensor:
    """Compressed-KV NVFP4 boundary: group 16, E4M3 scale (numerics 2c); `mode` picks the value rule."""
    return fp4_dequantize(*nvfp4_g16_quantize(x, mode), 16).to(x.dtype)


# ---- weight codecs (checkpoint layouts) ----

# Row chunks bound the FP32 temporaries when dequantizing very large tables (Engram: 384M rows).
_CHUNK_ELEMENTS = 1 << 22


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize: dtype {dtype}, expected torch.float32 or torch.bfloat16")
    return dtype


def _check_2d(name: str, t: Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    if t.dim() != 2 or t.dtype not in dtypes:
        raise ValueError(f"{name}: shape {tuple(t.shape)} dtype {t.dtype}, expected 2-D of {dtypes}")


def fp8_block_quantize(w: Tensor, block: tuple[int, int] = (32, 32)) -> tuple[Tensor, Tensor]:
    """w [R, C] -> (E4M3 [R, C], UE8M0 [ceil(R/br), ceil(C/bc)]) with one power-of-two scale per block."""
    _check_2d("fp8_block_quantize weight", w, (torch.float32, torch.bfloat16, torch.float16))
    (rows, cols), (br, bc) = w.shape, block
    padded = torch.nn.functional.pad(w.to(torch.float32), (0, -cols % bc, 0, -rows % br))
    blocks = padded.unflatten(0, (-1, br)).unflatten(2, (-1, bc))  # [R/br, br, C/bc, bc]
    scale = pow2_scale(blocks.abs().amax(dim=(1, 3)), FP8_AMAX_FLOOR, E4M3_MAX)
    values = e4m3_round(blocks / scale[:, None, :, None]).flatten(0, 1).flatten(1, 2)
    return values[:rows, :cols].contiguous(), e8m0_from_pow2(scale)


def fp8_block_dequantize(
    w: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32, block: tuple[int, int] = (32, 32)
) -> Tensor:
    """(E4M3 [R, C], UE8M0 [ceil(R/br), ceil(C/bc)]) -> [R, C] in dtype.

    Element (r, c) is `w[r, c] * scale[r // br, c // bc]`.
    """
    _check_2d("fp8_block weight", w, (torch.float8_e4m3fn,))
    (rows, cols), (br, bc) = w.shape, block
    want = (-(-rows // br), -(-cols // bc))
    if tuple(scale.shape) != want:
        raise ValueError(
            f"fp8_block scale: shape {tuple(scale.shape)}, expected {want} for weight {(rows, cols)}"
        )
    col_scale = e8m0_to_float(scale).repeat_interleave(bc, dim=1)[:, :cols]
    out = torch.empty((rows, cols), dtype=_out_dtype(dtype), device=w.device)
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    for begin in range(0, rows, step):
        end = min(rows, begin + step)
        block_rows = torch.arange(begin, end, device=w.device) // br
        out[begin:end] = w[begin:end].to(torch.float32) * col_scale[block_rows]
    return out


def _rows_dequantize(values: Tensor, scale: Tensor, group: int, name: str, dtype: torch.dtype) -> Tensor:
    """Row-chunked `decode(values)[r, c] * scale[r, c // group]`; FP4 rows are unpacked first."""
    rows, cols = values.shape[0], scale.shape[1] * group
    out = torch.empty((rows, cols), dtype=_out_dtype(dtype), device=values.device)
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    for begin in range(0, rows, step):
        chunk = values[begin : begin + step]
        if name == "fp4_rows":
            decoded = e2m1_values(unpack_nibbles(chunk), signed_zero=False)
        else:
            decoded = chunk.to(torch.float32)
        factors = e8m0_to_float(scale[begin : begin + step]).repeat_interleave(group, dim=1)
        out[begin : begin + step] = decoded * factors
    return out


def fp4_rows_quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [R, C] -> (packed E2M1 int8 [R, C/2], UE8M0 [R, C/32]); the MXFP4-g32 rule applied per row."""
    _check_2d("fp4_rows_quantize weight", w, (torch.float32, torch.bfloat16, torch.float16))
    codes, scale = mxfp4_g32_quantize(w)
    return pack_nibbles(codes).view(torch.int8), e8m0_from_pow2(scale)


def fp4_rows_dequantize(packed: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(packed int8 [R, C/2], UE8M0 [R, C/32]) -> [R, C] in dtype."""
    _check_2d("fp4_rows weight", packed, (torch.int8, torch.uint8))
    want = (packed.shape[0], packed.shape[1] * 2 // 32)
    if tuple(scale.shape) != want or packed.shape[1] % 16:
        raise ValueError(
            f"fp4_rows scale: shape {tuple(scale.shape)}, expected {want} for packed {tuple(packed.shape)}"
        )
    return _rows_dequantize(packed, scale, 32, "fp4_rows", dtype)


def fp8_rows_quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [R, C] -> (E4M3 [R, C], UE8M0 [R, C/32]); the FP8-g32 rule applied per row (Engram tables)."""
    _check_2d("fp8_rows_quantize weight", w, (torch.float32, torch.bfloat16, torch.float16))
    values, scale = fp8_g32_quantize(w)
    return values, e8m0_from_pow2(scale)


def fp8_rows_dequantize(w: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(E4M3 [R, C], UE8M0 [R, C/32]) -> [R, C] in dtype."""
    _check_2d("fp8_rows weight", w, (torch.float8_e4m3fn,))
    want = (w.shape[0], w.shape[1] // 32)
    if tuple(scale.shape) != want or w.shape[1] % 32:
        raise ValueError(
            f"fp8_rows scale: shape {tuple(scale.shape)}, expected {want} for weight {tuple(w.shape)}"
        )
    return _rows_dequantize(w, scale, 32, "fp8_rows", dtype)
