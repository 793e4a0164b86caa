"""CUDA rules of `linear` and `grouped_linear`: one Triton GEMM (linear_tl.py) for every weight format.

Serving numerics (ops/nn.py, platform/cpu/rules_core.py): `fp8_block32` weights are E4M3 with one UE8M0
scale per 32x32 block; `act_quant fp8_g32` quantizes each activation row per 32 columns to E4M3 with a
UE8M0 scale. The kernel quantizes the activation tile in registers with the cpu codec's exact rounding
(quant_tl.py), runs E4M3 x E4M3 tensor-core dots 32 columns at a time and applies both scales to each
FP32 partial sum. Other combinations:
- fp8 weights, act_quant none: weights converted to x's dtype in registers (bf16/f16 dots, exact
  products); f32 x (wo_b after the FP8 qdq of wo_a's output) is split exactly into three bf16 pieces, so
  three bf16 dots give exact products summed in FP32;
- dense weights, act_quant none: dots in the common dtype of x and w (FP32 IEEE when they differ);
- dense weights with act_quant fp8_g32 (no V4.1 graph uses it) and tensors not on a CUDA device (unless
  Triton's interpreter is on) fall back to the cpu rule.
Tile sizes are fixed, never chosen from the number of rows: batch invariant.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_core, rules_quant
from dsgraph.platform.cpu.dtypes import to_torch

__all__ = ["HOPPER_TILES", "RULES", "dot_kind", "grouped_linear", "linear"]

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). BLOCK_K is one 32-column scale block: with 128
# (four blocks per step) ptxas for sm_90a spills at 4 and 8 warps; 32 with 8 warps uses 194-246 registers
# and no spills (checked by cross-compiling, not yet timed). BLOCK_M stays 64 for every M (a decode step
# wastes tensor-core rows, not HBM bytes, which bound it).
HOPPER_TILES = (64, 128, 32, 8, 4)


def _uses_kernel(p: Any, x: Tensor) -> bool:
    if p.weight_format == "dense" and p.act_quant != "none":
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def dot_kind(act_quant: str, x: Tensor, dense_weight: Tensor | None) -> int:
    """linear_tl's DOT_* for activations x and a dense weight (None: an FP8 or FP4 weight, which converts
    exactly to any float dtype)."""
    from dsgraph.platform.cuda.kernels import linear_tl

    if act_quant == "fp8_g32":
        return linear_tl.DOT_FP8
    # Triton 3.6's interpreter multiplies bf16 dot operands as raw integers; off the GPU a bf16 dot runs
    # as an FP32 one, which gives the same products (bf16 x bf16 is exact in FP32).
    native = (torch.bfloat16, torch.float16) if x.is_cuda else (torch.float16,)
    if x.dtype in native and (dense_weight is None or dense_weight.dtype == x.dtype):
        return linear_tl.DOT_NATIVE
    if dense_weight is None:
        return linear_tl.DOT_SPLIT if x.is_cuda else linear_tl.DOT_SPLIT_F32
    return linear_tl.DOT_F32


def _run(p: Any, x3: Tensor, w: Tensor, scale: tuple[Tensor, ...], n_size: int) -> Tensor:
    """x3 [M, G, K] -> [M, G, N] in out_dtype through the Triton kernel."""
    from dsgraph.platform.cuda.kernels import linear_tl

    x3 = x3.contiguous()
    out = torch.empty((x3.shape[0], x3.shape[1], n_size), dtype=to_torch(p.out_dtype), device=x3.device)
    if out.numel() == 0:
        return out.zero_()
    scale_bytes = scale[0].contiguous().view(torch.uint8) if scale else None
    kind = dot_kind(p.act_quant, x3, w if p.weight_format == "dense" else None)
    linear_tl.launch(x3, w.contiguous(), scale_bytes, out, kind, HOPPER_TILES)
    return out


def linear(p: Any, x: Tensor, w: Tensor, *scale: Tensor) -> Tensor:
    """`x [*, k] @ w^T` (see ops/nn.py `linear`)."""
    if not _uses_kernel(p, x):
        return rules_core.linear(p, x, w, *scale)
    lead = x.shape[:-1]
    out = _run(p, x.reshape(-1, 1, x.shape[-1]), w, scale, w.shape[0])
    return out.reshape(*lead, w.shape[0])


def grouped_linear(p: Any, x: Tensor, w: Tensor, *scale: Tensor) -> Tensor:
    """`x [*, G, k]`, group g against rows g*n .. (g+1)*n - 1 of w (see ops/nn.py `grouped_linear`)."""
    if not _uses_kernel(p, x):
        return rules_quant.grouped_linear(p, x, w, *scale)
    lead, groups = x.shape[:-2], x.shape[-2]
    n_size = w.shape[0] // groups
    out = _run(p, x.reshape(-1, groups, x.shape[-1]), w, scale, n_size)
    return out.reshape(*lead, groups, n_size)


RULES: dict[str, Any] = {"linear": linear, "grouped_linear": grouped_linear}
