"""EPLB: choose which experts get the redundant slots and which rank holds each replica, from the
per-expert token counts of a sliding window of steps.

The placement minimises the most loaded rank, in two steps:
1. Replication (water filling): every expert has one replica; each redundant slot goes to the expert
   whose per-replica load (window tokens / replicas) is largest (ties: lowest id). This minimises the
   largest per-replica load, which bounds any rank's load from below.
2. Packing: each replica carries tokens / replicas (a token goes to copy `token % replicas`). Replicas
   go to ranks of `slots` slots each minimising the most loaded rank: an exact depth-first branch and
   bound, started from the longest-processing-time greedy (largest replica first, to the least loaded
   non-full rank, ties to the lowest rank), with replicas of equal load and ranks of equal state tried
   once. `max_nodes` bounds the search on large layers, where the best packing found so far is kept
   (never worse than the greedy one).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from dsgraph.runtime.distributed.placement import Placement

MAX_NODES = 20000


def replicate(loads: np.ndarray, slots: int) -> np.ndarray:
    """Replica counts per expert for `slots` physical slots (>= the number of experts)."""
    loads = np.asarray(loads, np.float64)
    counts = np.ones(len(loads), np.int64)
    for _ in range(slots - len(loads)):
        counts[int(np.argmax(loads / counts))] += 1  # argmax: first maximum, the lowest id
    return counts


def _greedy(weights: list[float], ep: int, slots: int) -> list[int]:
    sums, fill, where = [0.0] * ep, [0] * ep, []
    for w in weights:
        r = min((r for r in range(ep) if fill[r] < slots), key=lambda r: (sums[r], r))
        sums[r] += w
        fill[r] += 1
        where.append(r)
    return where


def pack(weights: list[float], ep: int, slots: int, max_nodes: int = MAX_NODES) -> list[int]:
    """Rank of each item (`weights` sorted descending) minimising the largest rank sum."""
    best = _greedy(weights, ep, slots)
    best_max = [max(_sums(weights, best, ep))]
    sums, fill, where, nodes = [0.0] * ep, [0] * ep, [0] * len(weights), [0]
    rest = np.concatenate([np.cumsum(weights[::-1])[::-1], [0.0]])
    lower = max(max(weights, default=0.0), float(rest[0]) / ep)
    if best_max[0] <= lower:
        return best

    def go(i: int) -> None:
        if i == len(weights):
            if max(sums) < best_max[0]:
                best_max[0], best[:] = max(sums), list(where)
            return
        tried: set[tuple[float, int]] = set()
        for r in sorted(range(ep), key=lambda r: (sums[r], r)):
            state = (sums[r], fill[r])
            if fill[r] == slots or state in tried or sums[r] + weights[i] >= best_max[0]:
                continue
            nodes[0] += 1
            if nodes[0] > max_nodes or best_max[0] <= lower:
                return
            tried.add(state)
            sums[r] += weights[i]
            fill[r] += 1
            where[i] = r
            go(i + 1)
            sums[r] -= weights[i]
            fill[r] -= 1

    go(0)
    return best


def _sums(weights: list[float], where: list[int], ep: int) -> list[float]:
    out = [0.0] * ep
    for w, r in zip(weights, where, strict=True):
        out[r] += w
    return out


def rebalance(p: Placement, loads: np.ndarray, max_nodes: int = MAX_NODES) -> Placement:
    """The placement of `p`'s slots for window `loads` (tokens per logical expert)."""
    slots = len(p.phys_to_logical)
    counts = replicate(loads, slots)
    replicas = [e for e in range(p.num_logical) for _ in range(int(counts[e]))]
    per = [float(loads[e]) / counts[e] for e in replicas]
    order = sorted(range(len(replicas)), key=lambda i: (-per[i], replicas[i]))
    ranks = pack([per[i] for i in order], p.ep, p.slots_per_rank, max_nodes)
    by_rank: list[list[int]] = [[] for _ in range(p.ep)]
    for i, r in zip(order, ranks, strict=True):
        by_rank[r].append(replicas[i])
    return Placement(p.num_logical, p.ep, tuple(e for rank in by_rank for e in sorted(rank)))


def imbalance(p: Placement, loads: np.ndarray) -> float:
    """Slowest rank over the mean rank (1.0: balanced; 1.0 when there is no load)."""
    r = p.rank_loads(loads)
    return float(r.max() / r.mean()) if r.mean() > 0 else 1.0


class ExpertStats:
    """Per-MoE token counts of the last `window` steps (all ranks record every round, so windows align)."""

    def __init__(self, window: int) -> None:
        self.window: dict[str, deque[np.ndarray]] = {}
        self.size = window

    def record(self, counts: dict[str, np.ndarray]) -> None:
        for moe, c in counts.items():
            self.window.setdefault(moe, deque(maxlen=self.size)).append(c)

    def loads(self, moe: str, num: int) -> np.ndarray:
        ring = self.window.get(moe)
        return np.sum(ring, axis=0) if ring else np.zeros(num, np.int64)
