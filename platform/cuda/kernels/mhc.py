"""cuda rules of `hc_pre`, `hc_collapse` and `hc_expand` (dsgraph.ops.mhc), and of `hc_expand_pre`
(ops/fused.py: hc_pre's kernel computing the streams it reads as hc_expand's would, and writing them):
Triton kernels (mhc_tl.py; one launch each) in place of the cpu rules' dozens of small torch kernels
(hc_pre's 20 Sinkhorn iterations).

Numerics against platform/cpu/rules_mhc.py: hc_collapse and hc_expand are bit-equal (products rounded,
streams summed in order, one cast). hc_pre's projection and sum of squares are f32 dots over n*H values
in another order than the cpu rule's bmm/mean (a few f32 ulps; fixed SPLIT-column slices added in
order); everything after them follows the cpu rule's arithmetic, so with the same projections (e.g.
exactly representable ones) the results are bit-equal. Batch invariant: a row's programs read only that
row, with tiles fixed by the shapes, never by the number of rows. CPU tensors without Triton's
interpreter go to the cpu rules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_fused, rules_mhc
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.arrival_counts import arrival_counts
from dsgraph.platform.cuda.kernels.attention import runs_kernels

__all__ = ["RULES", "hc_collapse", "hc_expand", "hc_expand_pre", "hc_pre"]

SPLIT = 1024  # hc_pre's columns per partial program (n*H = 20480 -> 20 programs per row)
BLOCK_K = 128  # hc_pre's K tile: [2n+n^2+1 (padded to 32), 128] f32 partial products
BLOCK_H = 512  # hidden columns per collapse/expand program (10 per token at hidden 5120)
NUM_WARPS = 4


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def triton_dtype(dtype: torch.dtype) -> Any:
    import triton.language as tl

    table = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
    if dtype not in table:
        raise TypeError(f"mhc kernels: dtype {dtype}, expected one of {list(table)}")
    return table[dtype]


def _launch_pre(
    p: Any, x: Tensor, fn: Tensor, base: Tensor, scale: Tensor, expand: tuple[Tensor, ...] | None
) -> tuple[Tensor, Tensor, Tensor]:
    """hc_pre_kernel over streams x [tokens, n, H]; with `expand` = (y, old streams, post, comb) the
    kernel first computes x as hc_expand would, writing it (x is then an empty tensor to fill)."""
    from dsgraph.platform.cuda.kernels import mhc_tl as K

    tokens, n, hidden = x.shape
    width, mixes = n * hidden, 2 * n + n * n
    pre = torch.empty((tokens, n), dtype=torch.float32, device=x.device)
    post = torch.empty((tokens, n), dtype=torch.float32, device=x.device)
    comb = torch.empty((tokens, n, n), dtype=torch.float32, device=x.device)
    if tokens:
        splits, padded = triton_cdiv(width, SPLIT), next_pow2(mixes + 1)
        part = torch.empty((tokens, splits, padded), dtype=torch.float32, device=x.device)
        y, old, post_in, comb_in = (t.contiguous() for t in expand) if expand else (x, x, pre, comb)
        K.hc_pre_kernel[(tokens, splits)](
            x, fn.contiguous(), part, arrival_counts(x.device, tokens), base.contiguous(),
            scale.contiguous(), pre, post, comb, float(p.eps), float(p.norm_eps), y, old, post_in, comb_in,
            K=width, R=mixes, RP=padded, SPLIT=SPLIT, BLOCK_K=BLOCK_K, N=n, NP=next_pow2(n),
            ITERS=p.sinkhorn_iters, EXPAND=expand is not None, OUT=triton_dtype(x.dtype),
            num_warps=NUM_WARPS, enable_fp_fusion=False, **pdl.launch(),
        )  # fmt: skip
    return pre, post, comb


def hc_pre(p: Any, x: Tensor, fn: Tensor, base: Tensor, scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if not runs_kernels(x):
        return rules_mhc.hc_pre(p, x, fn, base, scale)
    return _launch_pre(p, x.contiguous(), fn, base, scale, None)


def hc_expand_pre(
    p: Any, y: Tensor, x: Tensor, post: Tensor, comb: Tensor, fn: Tensor, base: Tensor, scale: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """hc_expand, then hc_pre of its result, in one launch (ops/fused.py)."""
    if not runs_kernels(x):
        return rules_fused.hc_expand_pre(p, y, x, post, comb, fn, base, scale)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return (out, *_launch_pre(p, out, fn, base, scale, (y, x, post, comb)))


def hc_collapse(p: Any, x: Tensor, a: Tensor) -> Tensor:
    if not runs_kernels(x):
        return rules_mhc.hc_collapse(p, x, a)
    from dsgraph.platform.cuda.kernels import mhc_tl as K

    tokens, n, hidden = x.shape
    out_dtype = to_torch(p.out_dtype)
    out = torch.empty((tokens, hidden), dtype=out_dtype, device=x.device)
    if tokens and hidden:
        grid = (tokens, triton_cdiv(hidden, BLOCK_H))
        K.hc_collapse_kernel[grid](
            x.contiguous(), a.contiguous(), out, hidden, N=n, BLOCK=BLOCK_H, OUT=triton_dtype(out_dtype),
            num_warps=NUM_WARPS, enable_fp_fusion=False, **pdl.launch(),
        )  # fmt: skip
    return out


def hc_expand(p: Any, y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    if not runs_kernels(x):
        return rules_mhc.hc_expand(p, y, x, post, comb)
    from dsgraph.platform.cuda.kernels import mhc_tl as K

    tokens, n, hidden = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if tokens and hidden:
        grid = (tokens, triton_cdiv(hidden, BLOCK_H))
        K.hc_expand_kernel[grid](
            y.contiguous(), x.contiguous(), post.contiguous(), comb.contiguous(), out, hidden, N=n,
            BLOCK=BLOCK_H, OUT=triton_dtype(x.dtype), num_warps=NUM_WARPS, enable_fp_fusion=False,
            **pdl.launch(),
        )  # fmt: skip
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


RULES: dict[str, Any] = {
    "hc_pre": hc_pre,
    "hc_collapse": hc_collapse,
    "hc_expand": hc_expand,
    "hc_expand_pre": hc_expand_pre,
}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them)
KERNELS: dict[str, tuple[str, ...]] = {
    "hc_pre": ("mhc_tl.hc_pre_kernel",),
    "hc_collapse": ("mhc_tl.hc_collapse_kernel",),
    "hc_expand": ("mhc_tl.hc_expand_kernel",),
    "hc_expand_pre": ("mhc_tl.hc_pre_kernel",),
}
