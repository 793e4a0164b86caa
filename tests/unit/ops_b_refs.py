"""Shared helpers and hand references of the group B unit tests (test_ops_b*.py load this file by path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsgraph.graph import TensorType, make_graph
from dsgraph.platform.cpu.interpret import run_graph


def tt(shape: tuple, dtype: str = "i32") -> TensorType:
    return TensorType(tuple(shape), dtype)


def run1(
    fn: Callable[..., Any], types: list[TensorType], args: list[torch.Tensor]
) -> dict[str, torch.Tensor]:
    return run_graph(make_graph(fn, *types), args)


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def pool_pairs(u: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor) -> torch.Tensor:
    """Hand reference of ratio-2 pooling over consecutive pairs of rows of one sequence: [len // 2, D]."""
    out = []
    for g in range(u.shape[0] // 2):
        v = torch.stack([wkv @ u[2 * g], wkv @ u[2 * g + 1]])
        s = torch.stack([wgate @ u[2 * g], wgate @ u[2 * g + 1]])
        w = torch.exp(s - s.max(0).values) / torch.exp(s - s.max(0).values).sum(0)
        out.append((w * v).sum(0))
    return torch.stack(out)


def attend(q: torch.Tensor, keys: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """Hand reference for one row: q [nh, hd], keys [N, hd] -> [nh, hd], in float64."""
    logits = (q.double() @ keys.double().T) * scale
    weights = torch.exp(logits)
    denominator = weights.sum(-1, keepdim=True) + torch.exp(sink.double()).unsqueeze(-1)
    return ((weights / denominator) @ keys.double()).float()
