"""Byte layouts of one cache entry of width D (spec model-v41 section 6).

An entry is a row of uint8 `[..., entry_bytes]`:
- FP8-g32 (SWA KV):         D bytes E4M3, then D/32 UE8M0 scale bytes          (D=512 -> 528 B)
- NVFP4-g16 (compressed KV): D/2 packed E2M1 bytes, then D/16 E4M3 scale bytes  (D=512 -> 288 B)
- MXFP4-g32 (index keys):    D/2 packed E2M1 bytes, then D/32 UE8M0 scale bytes (D=128 -> 68 B)
- F32 (unquantized caches):  4*D bytes, the little-endian f32 values
Packed bytes hold the even column in the low nibble. `decode(encode(x))` equals the codec's qdq(x)
exactly (same dtype).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsgraph.platform.cpu.quant import (
    NvfpMode,
    e4m3_round,
    e8m0_from_pow2,
    e8m0_to_float,
    fp4_dequantize,
    fp8_g32_dequantize,
    fp8_g32_quantize,
    mxfp4_g32_quantize,
    nvfp4_g16_quantize,
    pack_nibbles,
    unpack_nibbles,
)

__all__ = [
    "f32_decode",
    "f32_encode",
    "fp8_g32_decode",
    "fp8_g32_encode",
    "fp8_g32_entry_bytes",
    "mxfp4_g32_decode",
    "mxfp4_g32_encode",
    "mxfp4_g32_entry_bytes",
    "nvfp4_g16_decode",
    "nvfp4_g16_encode",
    "nvfp4_g16_entry_bytes",
]


def fp8_g32_entry_bytes(width: int) -> int:
    return width + width // 32


def nvfp4_g16_entry_bytes(width: int) -> int:
    return width // 2 + width // 16


def mxfp4_g32_entry_bytes(width: int) -> int:
    return width // 2 + width // 32


def f32_encode(x: Tensor) -> Tensor:
    return x.to(torch.float32).contiguous().view(torch.uint8)


def f32_decode(entry: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    _width(entry, "f32", 1, 4)
    return entry.contiguous().view(torch.float32).to(dtype)


def _width(entry: Tensor, codec: str, num: int, den: int) -> int:
    """Entry width D from entry_bytes = D * den / num; raise naming the codec when it does not divide."""
    if entry.dtype != torch.uint8:
        raise TypeError(f"{codec} entry: dtype {entry.dtype}, expected torch.uint8")
    size = entry.shape[-1]
    if size == 0 or (size * num) % den:
        raise ValueError(f"{codec} entry: {size} bytes is not {den}/{num} of a valid width")
    return size * num // den


def fp8_g32_encode(x: Tensor) -> Tensor:
    """x [..., D] -> uint8 [..., D + D/32]."""
    values, scale = fp8_g32_quantize(x)
    return torch.cat((values.view(torch.uint8), e8m0_from_pow2(scale).view(torch.uint8)), dim=-1)


def fp8_g32_decode(entry: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """uint8 [..., D + D/32] -> [..., D] in dtype."""
    width = _width(entry, "fp8_g32", 32, 33)
    values = entry[..., :width].contiguous().view(torch.float8_e4m3fn)
    return fp8_g32_dequantize(values, e8m0_to_float(entry[..., width:].contiguous())).to(dtype)


def nvfp4_g16_encode(x: Tensor, mode: NvfpMode = "divide") -> Tensor:
    """x [..., D] -> uint8 [..., D/2 + D/16]."""
    codes, scale = nvfp4_g16_quantize(x, mode)
    scale_bytes = e4m3_round(scale).view(torch.uint8)  # exact: the scale already is an E4M3 value
    return torch.cat((pack_nibbles(codes), scale_bytes), dim=-1)


def nvfp4_g16_decode(entry: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """uint8 [..., D/2 + D/16] -> [..., D] in dtype."""
    width = _width(entry, "nvfp4_g16", 16, 9)
    codes = unpack_nibbles(entry[..., : width // 2])
    scale = entry[..., width // 2 :].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    return fp4_dequantize(codes, scale, 16).to(dtype)


def mxfp4_g32_encode(x: Tensor) -> Tensor:
    """x [..., D] -> uint8 [..., D/2 + D/32]."""
    codes, scale = mxfp4_g32_quantize(x)
    return torch.cat((pack_nibbles(codes), e8m0_from_pow2(scale).view(torch.uint8)), dim=-1)


def mxfp4_g32_decode(entry: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """uint8 [..., D/2 + D/32] -> [..., D] in dtype."""
    width = _width(entry, "mxfp4_g32", 32, 17)
    codes = unpack_nibbles(entry[..., : width // 2])
    return fp4_dequantize(codes, e8m0_to_float(entry[..., width // 2 :].contiguous()), 32).to(dtype)
