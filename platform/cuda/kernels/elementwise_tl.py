"""Element-wise Triton kernels (their rules: elementwise.py). Importing this module imports triton."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_tl import round_f32_to


@triton.jit
def add_f32_kernel(a_ptr, b_ptr, out_ptr, size, BLOCK: tl.constexpr, PDL: tl.constexpr = False) -> None:
    """Grid cdiv(size, BLOCK): out = f32(a) + f32(b) rounded once to out's dtype (the cpu rule's
    add_f32; both inputs and out contiguous, of one shape)."""
    pdl_tl.enter(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, round_f32_to(a + b, out_ptr.dtype.element_ty), mask=mask)


def launch_add_f32(a: Tensor, b: Tensor, out: Tensor, size: int, block: int) -> None:
    add_f32_kernel[(triton.cdiv(size, block),)](a, b, out, size, BLOCK=block, num_warps=4, **pdl.launch())
