"""Quantization codecs: scalar rounding rules, byte layouts, weight codecs (spec 3.3, 6, 8)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgraph.platform.cpu import cache_format as cf
from dsgraph.platform.cpu import quant as q

LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def ref_pow2_ceil(v: float) -> float:
    """Independent ceiling via frexp: v = m * 2^e with m in [0.5, 1)."""
    m, e = math.frexp(v)
    return 2.0 ** (e - 1) if m == 0.5 else 2.0**e


def ref_e2m1(v: float) -> float:
    """Nearest level of |v| clamped to 6; an exact midpoint picks the level with the even index."""
    mag = min(abs(v), 6.0)
    best = min(range(8), key=lambda i: (abs(LEVELS[i] - mag), i % 2))
    return math.copysign(LEVELS[best], v)


def ref_fp8_scale(amax: float) -> float:
    product = np.float32(max(np.float32(amax), np.float32(1e-4))) * np.float32(1 / 448)
    return ref_pow2_ceil(float(product))


@pytest.mark.parametrize("v", [1.0, 1.5, 2.0, 3.0, 2.0**-126, 0.75, 1e-7, 448.0, 1.0000001, 2.0**100 * 1.01])
def test_pow2_ceil_matches_frexp_reference(v: float) -> None:
    got = q.pow2_ceil(torch.tensor([v], dtype=torch.float32)).item()
    assert got == ref_pow2_ceil(float(np.float32(v)))


def test_pow2_scale_examples() -> None:
    amax = torch.tensor([448.0, 448.0 * 4, 449.0, 7.0, 0.0], dtype=torch.float32)
    got = q.pow2_scale(amax, 1e-4, 448.0).tolist()
    assert got == [ref_fp8_scale(a) for a in amax.tolist()]
    assert got[:3] == [1.0, 4.0, 2.0]
    assert got[4] == 2.0**-22  # the floor: 1e-4 / 448 = 2.2e-7 -> 2^-22


@pytest.mark.parametrize(
    ("x", "want"),
    [
        (0.25, 0.0),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
        (0.7499, 0.5),
        (0.7501, 1.0),
        (7.0, 6.0),
        (-0.75, -1.0),
        (-5.0, -4.0),
        (-0.1, -0.0),
        (-100.0, -6.0),
    ],
)
def test_e2m1_ties_to_even_code(x: float, want: float) -> None:
    got = q.e2m1_values(q.e2m1_codes(torch.tensor([x]))).item()
    assert got == want and math.copysign(1, got) == math.copysign(1, want)


@given(st.lists(st.floats(-8, 8, allow_nan=False, width=32), min_size=1, max_size=64))
@settings(max_examples=60, deadline=None)
def test_e2m1_matches_reference(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    got = q.e2m1_values(q.e2m1_codes(x)).tolist()
    assert got == [ref_e2m1(v) for v in x.tolist()]


@pytest.mark.parametrize(
    ("x", "want"), [(1.0625, 1.0), (1.1875, 1.25), (500.0, 448.0), (-1e9, -448.0), (2**-10, 0.0)]
)
def test_e4m3_round_nearest_even_and_clamp(x: float, want: float) -> None:
    assert q.e4m3_round(torch.tensor([x])).float().item() == want


def test_nvfp4_divide_vs_reciprocal_example() -> None:
    sf = 0.029296875  # an E4M3 value; amax = 6 sf makes it the group scale
    x = torch.full((16,), 1.25 * sf)
    x[0] = 6 * sf
    assert q.nvfp4_g16_qdq(x, "divide")[1].item() / sf == 1.0
    assert q.nvfp4_g16_qdq(x, "reciprocal")[1].item() / sf == 1.5


def test_fp8_qdq_matches_reference() -> None:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)) * 3
    got = q.fp8_g32_qdq(x)
    for row in range(8):
        for g in range(2):
            chunk = x[row, 32 * g : 32 * g + 32]
            scale = ref_fp8_scale(chunk.abs().max().item())
            want = (chunk / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
            assert torch.equal(got[row, 32 * g : 32 * g + 32], want)


def test_mxfp4_qdq_matches_reference() -> None:
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    got = q.mxfp4_g32_qdq(x)
    for row in range(4):
        amax = np.float32(max(np.float32(x[row].abs().max().item()), np.float32(6 * 2.0**-126)))
        scale = ref_pow2_ceil(float(amax * np.float32(1 / 6)))
        want = [ref_e2m1(float(np.float32(v) / np.float32(scale))) * scale for v in x[row].tolist()]
        assert got[row].tolist() == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qdq_keeps_dtype_shape_and_is_idempotent(dtype: torch.dtype) -> None:
    x = (torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(3)) * 10).to(dtype)
    for fn in (q.fp8_g32_qdq, q.mxfp4_g32_qdq, q.nvfp4_g16_qdq):
        y = fn(x)
        assert y.dtype == dtype and y.shape == x.shape
        assert torch.equal(fn(y), y)


def test_qdq_rejects_partial_groups() -> None:
    with pytest.raises(ValueError, match="fp8_g32: last dim 48"):
        q.fp8_g32_qdq(torch.zeros(2, 48))


@pytest.mark.parametrize(
    ("encode", "decode", "qdq", "width", "size"),
    [
        (cf.fp8_g32_encode, cf.fp8_g32_decode, q.fp8_g32_qdq, 512, 528),
        (cf.nvfp4_g16_encode, cf.nvfp4_g16_decode, q.nvfp4_g16_qdq, 512, 288),
        (cf.mxfp4_g32_encode, cf.mxfp4_g32_decode, q.mxfp4_g32_qdq, 128, 68),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entry_bytes_and_roundtrip(
    encode: Callable[[torch.Tensor], torch.Tensor],
    decode: Callable[[torch.Tensor, torch.dtype], torch.Tensor],
    qdq: Callable[[torch.Tensor], torch.Tensor],
    width: int,
    size: int,
    dtype: torch.dtype,
) -> None:
    gen = torch.Generator().manual_seed(width + size)
    x = (torch.randn(2, 7, width, generator=gen) * torch.logspace(-5, 5, 7)[:, None]).to(dtype)
    x[0, 0] = 0.0
    entry = encode(x)
    assert entry.dtype == torch.uint8 and entry.shape == (2, 7, size)
    assert torch.equal(decode(entry, dtype), qdq(x))


def test_fp8_entry_layout() -> None:
    x = torch.zeros(64)
    x[0], x[1], x[40] = 448.0, -1.0, 3.0  # group 0 amax 448 -> scale 1, group 1 amax 3 -> scale 2^-7
    e = cf.fp8_g32_encode(x)
    assert e[:2].tolist() == [0x7E, 0xB8]  # E4M3 448 = 0 1111 110, -1 = 1 0111 000
    assert e[40].item() == 0x7C  # 3 / 2^-7 = 384 = 1.5 * 2^8 = 0 1111 100
    assert e[64:].tolist() == [127, 127 - 7]


def test_fp4_packing_low_nibble_is_even_column() -> None:
    x = torch.zeros(32)
    x[0], x[1], x[2] = 6.0, -0.5, 1.0  # amax 6 -> scale 1; codes 7, 9, 2
    e = cf.mxfp4_g32_encode(x)
    assert e[0].item() == 7 | (9 << 4) and e[1].item() == 2
    assert e[16].item() == 127


def test_decode_rejects_bad_entry_size() -> None:
    with pytest.raises(ValueError, match="nvfp4_g16 entry: 100 bytes"):
        cf.nvfp4_g16_decode(torch.zeros(100, dtype=torch.uint8))


def _fp8_err_ok(w: torch.Tensor, deq: torch.Tensor, scale: torch.Tensor) -> bool:
    # E4M3: 3 mantissa bits -> relative half-step 2^-4; subnormal step of the scaled grid is scale * 2^-9.
    return bool(((deq - w).abs() <= w.abs() * 2.0**-4 + scale * 2.0**-10).all())


@pytest.mark.parametrize("shape", [(64, 96), (40, 70)])
def test_fp8_block_roundtrip_and_scale_index(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(shape, generator=gen)
    w[:32, :32] *= 1000.0  # one loud block must not change the others' scales
    values, scale = q.fp8_block_quantize(w)
    assert values.dtype == torch.float8_e4m3fn and scale.dtype == torch.float8_e8m0fnu
    assert scale.shape == (-(-shape[0] // 32), -(-shape[1] // 32))
    s = q.e8m0_to_float(scale)
    assert s[0, 0].item() == ref_fp8_scale(w[:32, :32].abs().max().item())
    assert s[1, 1].item() == ref_fp8_scale(w[32:64, 32:64].abs().max().item())
    deq = q.fp8_block_dequantize(values, scale)
    per_elem = s.repeat_interleave(32, 0)[: shape[0]].repeat_interleave(32, 1)[:, : shape[1]]
    assert _fp8_err_ok(w, deq, per_elem)
    assert torch.equal(q.fp8_block_dequantize(values, scale, torch.bfloat16), deq.bfloat16())


def test_fp4_rows_roundtrip() -> None:
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(5))
    packed, scale = q.fp4_rows_quantize(w)
    assert packed.dtype == torch.int8 and packed.shape == (16, 32) and scale.shape == (16, 2)
    deq = q.fp4_rows_dequantize(packed, scale)
    assert torch.equal(deq, q.mxfp4_g32_qdq(w))  # equal values; code 8 decodes to +0 here, -0 in the qdq
    assert not torch.signbit(
        q.fp4_rows_dequantize(torch.tensor([[8]], dtype=torch.int8).repeat(1, 16), scale[:1, :1])
    ).any()
    s = q.e8m0_to_float(scale).repeat_interleave(32, 1)
    assert bool(((deq - w).abs() <= s * torch.clamp((w / s).abs() / 4, min=0.25)).all())


def test_fp8_rows_roundtrip() -> None:
    w = torch.randn(10, 64, generator=torch.Generator().manual_seed(6)) * 0.01
    values, scale = q.fp8_rows_quantize(w)
    assert scale.shape == (10, 2)
    deq = q.fp8_rows_dequantize(values, scale)
    assert torch.equal(deq, q.fp8_g32_qdq(w))
    assert _fp8_err_ok(w, deq, q.e8m0_to_float(scale).repeat_interleave(32, 1))


def test_weight_dequantize_errors_name_the_codec() -> None:
    values, scale = q.fp8_block_quantize(torch.randn(64, 64))
    with pytest.raises(ValueError, match=r"fp8_block scale: shape \(1, 2\), expected \(2, 2\)"):
        q.fp8_block_dequantize(values, scale[:1])
    with pytest.raises(ValueError, match="dtype torch.float16"):
        q.fp8_block_dequantize(values, scale, torch.float16)
