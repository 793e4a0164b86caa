"""`moe_route` after the gate GEMM in one launch (rule in moe.py, which imports this lazily): from a row's
gate logits, the expert scores s = sqrt(softplus(logit)) as the cpu rule computes them (softplus in f64,
rounded to f32, then the f32 square root), and with the selection bias the top-k experts of s + bias in a
stable descending order (equal keys: the lowest id first; NaN before everything, as torch's descending
sort puts it), their unbiased scores renormalised to sum to `routed_scaling` (the sum taken in selection
order, f32). One program per row, so a row's result never depends on the batch. It replaces the score's
element-wise kernels, the bias add, torch's radix sort, the gathers and the renormalisation's kernels:
fourteen launches per MoE layer at decode."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels import pdl_tl


@triton.jit
def _softplus_f64(x):
    """torch's softplus in f64: x above 20, else log1p(exp(x)). log1p as log(u) * e / (u - 1) with
    u = 1 + e (exact where u rounds to 1: then log1p(e) = e), a few ulps of f64 like libm's, far below the
    f32 rounding that follows; Triton has no log1p its interpreter can run."""
    e = tl.exp(x)
    u = 1.0 + e
    small = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))
    return tl.where(x > 20.0, x, small)


@triton.jit
def route_select_kernel(
    logits_ptr,
    bias_ptr,
    bias_row_stride,
    weights_ptr,
    ids_ptr,
    num_experts,
    routed_scaling,
    eps,
    TOPK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    PDL: tl.constexpr = False,
) -> None:
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    real = e < num_experts
    logit = tl.load(logits_ptr + row * num_experts + e, mask=real, other=0.0)
    s = tl.sqrt_rn(_softplus_f64(logit.to(tl.float64)).to(tl.float32))
    key = s + tl.load(bias_ptr + row * bias_row_stride + e, mask=real, other=0.0)
    key = tl.where(key != key, float("inf"), key)  # NaN first, as in torch's descending sort
    taken = e >= num_experts  # the padding past the experts is never chosen while a real one is left
    slot = tl.arange(0, BLOCK_K)
    chosen = tl.zeros((BLOCK_K,), dtype=tl.float32)
    ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
    total = 0.0
    for i in tl.static_range(TOPK):
        best = tl.max(tl.where(taken, float("-inf"), key), axis=0)
        pick = tl.min(tl.where(~taken & (key == best), e, BLOCK_E), axis=0)
        score = tl.sum(tl.where(e == pick, s, 0.0), axis=0)
        chosen = tl.where(slot == i, score, chosen)
        ids = tl.where(slot == i, pick, ids)
        total += score
        taken |= e == pick
    weights = chosen / (total + eps) * routed_scaling
    mask = slot < TOPK
    tl.store(weights_ptr + row * TOPK + slot, weights, mask=mask)
    tl.store(ids_ptr + row * TOPK + slot, ids, mask=mask)


def launch_route_select(
    logits: Tensor, bias: Tensor, topk: int, routed_scaling: float, eps: float, weights: Tensor, ids: Tensor
) -> None:
    """logits [rows, E] f32 contiguous, bias [E] or [rows, E] f32 -> weights [rows, topk] f32, ids
    [rows, topk] int32 (topk <= E)."""
    rows, num_experts = logits.shape
    bias = bias.contiguous()
    row_stride = num_experts if bias.dim() == 2 else 0
    route_select_kernel[(rows,)](
        logits, bias, row_stride, weights, ids, num_experts, float(routed_scaling), float(eps),
        TOPK=topk, BLOCK_K=triton.next_power_of_2(topk), BLOCK_E=triton.next_power_of_2(num_experts),
        num_warps=4, **pdl.launch(),
    )  # fmt: skip
