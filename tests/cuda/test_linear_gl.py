"""The Gluon decode FP8 linear of tools/bench/linear_gl.py (an experiment linear_gl_ab.py times against the
default kernel): it compiles for sm_90 with the instructions it is about (CPU), and gives the default
swapped tiles' bits (GPU)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from dsgraph.tools.bench import linear_gl

fn = linear_gl.fp8_decode_kernel
for block_k, stages, split in ((128, 3, False), (256, 3, False), (128, 3, True)):
    types = dict(x_ptr="*fp32" if split else "*bf16", w_ptr="*fp8e4nv", s_ptr="*u8", out_ptr="*bf16",
                 part_ptr="*fp32", count_ptr="*i32")
    types |= {n: "i32" for n in ("m_size", "n_size", "x_stride_m", "x_stride_g", "out_stride_m",
                                 "out_stride_g", "out_size", "s_stride")}
    meta = dict(K_SIZE=8192, K_SPLIT=4096, BLOCK_M=16, BLOCK_K=block_k, STAGES=stages, X_SPLIT=split,
                num_warps=4)
    strides = ("x_stride_m", "x_stride_g", "s_stride")
    aligned = [n for n, t in types.items() if t.startswith("*") or n in strides]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = GluonASTSource(fn, {**types, **{n: "constexpr" for n in meta}}, meta, attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = k.asm["ptx"]
    wgmmas = ptx.count("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16")
    # one dot of BLOCK_K / 16 wgmmas a step, or per 32 columns three (hi, mid, lo) of two each
    assert wgmmas == (block_k // 16) * (3 if split else 1), (block_k, split, wgmmas)
    assert "cp.async.cg.shared.global" in ptx and ", 0x10" in ptx, "16-byte cp.async expected"
    assert k.metadata.shared <= 227 * 1024, k.metadata.shared
    print(block_k, stages, split, "ok", k.metadata.shared)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None, reason="no NVIDIA backend")
def test_it_compiles_for_hopper_with_wgmma_and_16_byte_copies() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "splits", "out_dtype"), [(1, 1, torch.bfloat16), (5, 2, torch.float32)])
def test_the_same_bits_as_the_default_swapped_tiles(x_dtype, rows, splits, out_dtype) -> None:
    from dsgraph.platform.cuda.kernels import linear_bf16_tl
    from dsgraph.platform.cuda.kernels.linear import Tiles
    from dsgraph.tools.bench import linear_gl

    gen = torch.Generator(device="cuda").manual_seed(rows * 10 + splits)
    n, k = 320, 1024
    x = torch.randn(rows, 1, k, generator=gen, device="cuda")
    x = linear_bf16_tl.qdq_rows(x) if x_dtype == torch.bfloat16 else x
    w = (torch.randn(n, k, generator=gen, device="cuda") * k**-0.5).to(torch.float8_e4m3fn)
    scale = torch.randint(118, 130, (n // 32, k // 32), generator=gen, device="cuda").to(torch.uint8)
    ref = torch.empty(rows, 1, n, dtype=out_dtype, device="cuda")
    linear_bf16_tl.launch(x, w, scale, ref, False, Tiles(16, 64, 256, 4, 3, True, True), splits)
    for block_k, stages in ((128, 3), (256, 3)):
        out = torch.full_like(ref, float("nan"))
        linear_gl.launch(x, w, scale, out, splits, 16, block_k, stages)
        bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
        assert torch.equal(out.view(bits), ref.view(bits)), (block_k, stages)
