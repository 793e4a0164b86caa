"""CUDA rules of the element-wise ops that have a kernel of their own (elementwise_tl.py); the others run
the cpu rules on device tensors (torch launches one kernel each).

- add_f32: `cast(cast(a, f32) + cast(b, f32), out_dtype)` in one launch instead of three (the MoE's
  routed sum plus its shared expert, once per layer): the same f32 add and one rounding, so the cpu
  rule's bits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_core
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cuda.kernels.attention import runs_kernels

__all__ = ["KERNELS", "RULES", "add_f32", "binary_operands"]

BLOCK = 1024  # elements per program


def binary_operands(a: Tensor, b: Tensor, out_dtype: str) -> tuple[Tensor, Tensor, Tensor]:
    """An element-wise kernel's operands: a and b broadcast to one shape and contiguous, and the empty
    output of that shape in out_dtype (the kernels index all three with one flat offset)."""
    a, b = torch.broadcast_tensors(a, b)
    out = torch.empty(a.shape, dtype=to_torch(out_dtype), device=a.device)
    return a.contiguous(), b.contiguous(), out


def add_f32(p: Any, a: Tensor, b: Tensor) -> Tensor:
    if not runs_kernels(a):
        return rules_core.add_f32(p, a, b)
    from dsgraph.platform.cuda.kernels.elementwise_tl import launch_add_f32

    a, b, out = binary_operands(a, b, p.out_dtype)
    if out.numel():
        launch_add_f32(a, b, out, out.numel(), BLOCK)
    return out


RULES: dict[str, Any] = {"add_f32": add_f32}
KERNELS: dict[str, tuple[str, ...]] = {"add_f32": ("elementwise_tl.add_f32_kernel",)}
