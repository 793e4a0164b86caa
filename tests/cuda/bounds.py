"""Error bounds of the GEMM-like ops, cuda against cpu, shared by the kernel tests and the
teacher-forced model check (test_e2e_gpu.py): the error of a sum scales with the sum of its terms'
magnitudes, not with its (cancelling) result."""

from __future__ import annotations

from typing import Any

import torch

from dsgraph.platform.cpu import rules_core, rules_moe
from dsgraph.platform.cpu.step_rows import rowwise_linear

# Hopper's FP8 tensor cores align a 32-column chunk's products to ~14 bits (tests/cuda/test_linear.py)
FP8_DOT_TOL = 2.0**-10
# moe_experts: FP8 tensor-core sums flip bf16/FP8 rounding points of the cpu path now and then; one
# flip moves a term by 2^-4 of its magnitude at most (tests/cuda/test_moe.py)
MOE_GPU_TOL = 2.0**-6


def moe_magnitude(
    p: Any, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ws: tuple
) -> torch.Tensor:
    """S = sum over a row's experts of |a_e| @ |w2_e|^T, from the cpu rule's own steps (f32, x's shape)."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    xin = rules_moe._gemm_input(p, x, x.dtype)
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        w1, w3, w2 = rules_moe._expert_weights(p, e, ws)
        g, v = rules_moe._gemm(p, xin[rows], w1), rules_moe._gemm(p, xin[rows], w3)
        act = rules_moe.swiglu_f32(g, v, p.swiglu_limit) * weights[rows, slots, None]
        out.index_add_(0, rows, rowwise_linear(act.abs(), w2.abs()))
    return out


def linear_abs_sum(op: str, p: Any, operands: list[torch.Tensor]) -> torch.Tensor:
    """|x'| @ |w'|^T of linear / grouped_linear (group g against rows g*n .. (g+1)*n - 1), x', w' the
    cpu rule's f32 GEMM operands."""
    xf, wf = rules_core.linear_operands(p, *operands)
    if op == "linear":
        return xf.abs() @ wf.abs().t()
    groups = xf.shape[-2]
    per_group = wf.abs().reshape(groups, wf.shape[0] // groups, wf.shape[1])
    return torch.einsum("...gk,gnk->...gn", xf.abs(), per_group)
