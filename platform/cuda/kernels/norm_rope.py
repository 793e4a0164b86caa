"""cuda rules of `rms_norm` and `rope` (dsgraph.ops.nn, dsgraph.ops.rope): one Triton kernel each
(norm_rope_tl.py) in place of the cpu rules' chains of small torch kernels.

Numerics against platform/cpu/rules_core.rms_norm and rules_rope.rope:
- rms_norm: the sum of squares is added in another order than torch's mean (a few f32 ulps in the
  factor, so at most one ulp of the output dtype now and then); the rest is the cpu rule's arithmetic;
- rope: the frequency table is the cpu helper's (computed on the host, kept per params and device);
  cos/sin are the f64 values rounded to f32 (the cpu rule's C-library cosf/sinf agree except in rare
  near-midpoint cases); angles and the rotation round as the cpu rule does, so results are nearly
  always bit-equal.
Batch invariant: each program reads one row (rms_norm) or one token's heads (rope), tiles fixed by the
shapes. CPU tensors without Triton's interpreter go to the cpu rules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_core, rules_rope
from dsgraph.platform.cuda.kernels.attention import runs_kernels
from dsgraph.platform.cuda.kernels.mhc import next_pow2, triton_cdiv, triton_dtype

__all__ = ["RULES", "rms_norm", "rope"]

NORM_BLOCK = 1024  # columns per step of rms_norm's two passes over a row
ROPE_BLOCK_H = 4  # heads per rope program (64 query heads: 16 programs per token at decode)
NUM_WARPS = 4


def rms_norm(p: Any, x: Tensor, w: Tensor) -> Tensor:
    if not runs_kernels(x) or x.dim() == 0:
        return rules_core.rms_norm(p, x, w)
    from dsgraph.platform.cuda.kernels import norm_rope_tl as K

    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows:
        K.rms_norm_kernel[(rows,)](
            x.contiguous(), w.contiguous(), out, float(p.eps), D=width,
            BLOCK=min(NORM_BLOCK, next_pow2(width)), OUT=triton_dtype(x.dtype), num_warps=NUM_WARPS,
            enable_fp_fusion=False,
        )  # fmt: skip
    return out


def rope(p: Any, x: Tensor, positions: Tensor) -> Tensor:
    if not runs_kernels(x) or x.dim() < 2 or p.rope_dim % 2 or x.shape[-1] < p.rope_dim:
        return rules_rope.rope(p, x, positions)
    from dsgraph.platform.cuda.kernels import norm_rope_tl as K

    tokens, width = x.shape[0], x.shape[-1]
    heads = x[0].numel() // width if tokens and width else 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if tokens and width:
        grid = (tokens, triton_cdiv(heads, ROPE_BLOCK_H))
        K.rope_kernel[grid](
            x.contiguous(), positions.contiguous(), rules_rope.rope_frequencies(p, x.device), out, heads,
            D=width,
            ROPE=p.rope_dim, INVERSE=bool(p.inverse), BLOCK_H=ROPE_BLOCK_H,
            BLOCK_D=next_pow2(max(width - p.rope_dim, 1)), BLOCK_P=next_pow2(max(p.rope_dim // 2, 1)),
            OUT=triton_dtype(x.dtype), num_warps=NUM_WARPS, enable_fp_fusion=False,
        )  # fmt: skip
    return out


RULES: dict[str, Any] = {"rms_norm": rms_norm, "rope": rope}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them)
KERNELS: dict[str, tuple[str, ...]] = {
    "rms_norm": ("norm_rope_tl.rms_norm_kernel",),
    "rope": ("norm_rope_tl.rope_kernel",),
}
