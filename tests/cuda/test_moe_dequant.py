"""The swap GEMM's MXFP4 dequantization (moe_swap_tl._dequantize) against the cpu checkpoint dequantizer,
exhaustively: every packed byte (both of its E2M1 codes, -0 included) under every UE8M0 scale byte (0:
the subnormal 2^-127, 255: NaN). The kernel places each code's bits into an FP32 and scales it by two
power-of-two multiplies; every one of those values must have the cpu dequantizer's exact bits (the GEMM's
operands are then the cpu rule's, so a dot gives the same bits as with any other exact dequantization).
Runs on the GPU where there is one, else under Triton's interpreter (one program, a few seconds)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on without a GPU
tl = triton.language

from dsgraph.platform.cpu.quant import fp4_rows_dequantize  # noqa: E402
from dsgraph.platform.cuda.kernels import moe_swap_tl  # noqa: E402
from tests.cuda.kernel_env import DEVICE  # noqa: E402


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, out_ptr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr) -> None:
    """One program: rows [BLOCK_W] x columns [BLOCK_K] dequantized as swap_gemm_kernel does (in FP32)."""
    n = tl.arange(0, BLOCK_W)
    words, s = moe_swap_tl._load_packed(w_ptr, s_ptr, n, n < BLOCK_W, 0, BLOCK_K, BLOCK_K, True, True)
    w = moe_swap_tl._dequantize(words, s, BLOCK_W, BLOCK_K, True)
    tl.store(out_ptr + n[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :], w)


def test_dequantize_is_the_cpu_dequantizer_for_every_byte_and_scale() -> None:
    rows, cols = 256, 512  # row r: scale byte r; its 256 packed bytes: every byte once
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8).repeat(rows, 1)
    scale = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, cols // 32)
    out = torch.empty(rows, cols, device=DEVICE)
    _dequantize_kernel[(1,)](packed.to(DEVICE), scale.to(DEVICE), out, BLOCK_W=rows, BLOCK_K=cols)
    ref = fp4_rows_dequantize(packed, scale.view(torch.float8_e8m0fnu))
    got = out.cpu()
    same = (got.view(torch.int32) == ref.view(torch.int32)) | (got.isnan() & ref.isnan())
    bad = (~same).nonzero()[:4].tolist()
    assert same.all(), [(r, c, float(got[r, c]), float(ref[r, c])) for r, c in bad]
    assert ref.isnan().sum() == cols and (ref[:255].view(torch.int32) == -(2**31)).sum() == 0  # no -0
