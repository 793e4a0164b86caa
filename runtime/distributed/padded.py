"""The fixed-capacity form of the expert exchange: every (source, destination) rank pair carries exactly
`capacity` rows, real ones first and padding after, so dispatch returns ep * capacity rows and both
all-to-alls have equal, static splits whatever the routing: the shapes a captured step needs.

A padding row has local slot -1 (no expert computes it: moe_experts skips ids < 0) and weight 0; its
output goes back and is ignored, so a token's sum is the dynamic exchange's, bit for bit. Overflow is
exact, never a dropped token: before a layer's exchange the group takes the largest pair count with one
all-reduce, and a layer whose count exceeds the capacity uses the dynamic exchange (the eager path).
`worst_case(tokens, k, slots)` is a capacity that never overflows for steps of up to `tokens` rows per
rank: a token's k distinct experts put at most min(k, slots per rank) pairs on one rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

Tensor = torch.Tensor


def worst_case(tokens: int, k: int, slots_per_rank: int) -> int:
    return tokens * min(k, slots_per_rank)


def fits(counts: list[int], capacity: int, group: Any) -> bool:
    """Whether every rank's every pair count fits (the same answer on every rank: one all-reduce)."""
    worst = torch.tensor([max(counts, default=0)], dtype=torch.int64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return int(worst[0]) <= capacity


def positions(dest_sorted: Tensor, counts: list[int], capacity: int) -> Tensor:
    """Row of each sorted pair in the padded send buffer: destination block, then rank within it."""
    c = torch.tensor(counts, dtype=torch.int64, device=dest_sorted.device)
    starts = torch.cumsum(c, 0) - c
    within = torch.arange(dest_sorted.numel(), device=dest_sorted.device) - starts[dest_sorted]
    return dest_sorted * capacity + within


def exchange(rows: Tensor, pos: Tensor, ep: int, capacity: int, pad: Tensor, group: Any) -> Tensor:
    """The all-to-all of `rows` placed at `pos` of a [ep * capacity, width] buffer filled with `pad`."""
    send = pad.expand(ep * capacity, rows.shape[1]).clone()
    send[pos] = rows
    out = torch.empty_like(send)
    dist.all_to_all_single(out, send, group=group)
    return out


def back(y: Tensor, group: Any) -> Tensor:
    """The reverse exchange: each received block's outputs to its source rank (equal splits)."""
    out = torch.empty_like(y)
    dist.all_to_all_single(out, y.contiguous(), group=group)
    return out
