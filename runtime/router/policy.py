"""Routing policies as pure functions over the engines' loads (the router and the simulation in
tools/bench/router_sim.py share them).

Decode: an engine's step time grows with its batch (per-sequence work: the MoE, sampling) and with the
KV tokens its attention reads; `decode_cost` is that time in units of one sequence, and a request goes
where the cost after adding it is least. Prefill: requests fall in context-length buckets; a request
goes to the engine that finishes it first (its queued prefill seconds plus this request's time under
the fitted cost model, in chunks that each fill the step budget)."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from dsgraph.runtime.router.cost import QuadraticCost


@dataclass(frozen=True)
class Candidate:
    """One engine as a policy sees it."""

    name: str
    batch: int = 0  # requests running or queued
    kv_tokens: int = 0  # context tokens those requests hold
    backlog_s: float = 0.0  # prefill seconds queued (estimated with the cost model)
    max_batch: int = 0  # 0: unknown


@dataclass(frozen=True)
class PrefillPlan:
    index: int  # into the candidates
    bucket: int
    chunks: tuple[int, ...]  # the chunk sizes that fill the step budget, in order
    seconds: float  # estimated prefill time of the request alone


def context_bucket(tokens: int, bounds: Sequence[int]) -> int:
    """0 for < bounds[0], ..., len(bounds) for >= bounds[-1]."""
    return bisect.bisect_right(list(bounds), tokens)


def decode_cost(batch: int, kv_tokens: int, kv_per_seq: float) -> float:
    """Step cost in sequences: `kv_per_seq` KV tokens of attention cost as much as one sequence."""
    return batch + kv_tokens / kv_per_seq


def _full(c: Candidate) -> bool:
    return c.max_batch > 0 and c.batch >= c.max_batch


def choose_decode(cands: Sequence[Candidate], tokens: int, kv_per_seq: float, turn: int = 0) -> int:
    """The engine whose step cost after adding a request of `tokens` context is least; engines with a
    full batch only when all are. Ties go round the engines from `turn` (a router passes a counter), so
    idle engines share the requests instead of the first one taking them all."""
    n = len(cands)
    room = [i for i, c in enumerate(cands) if not _full(c)] or list(range(n))
    cost = lambda i: decode_cost(cands[i].batch + 1, cands[i].kv_tokens + tokens, kv_per_seq)  # noqa: E731
    return min(room, key=lambda i: (cost(i), (i - turn) % n))


def plan_chunks(tokens: int, cost: QuadraticCost, budget_s: float, min_chunk: int) -> tuple[int, ...]:
    """Chunk sizes for prefilling `tokens`: each step fills `budget_s`, later chunks shrink as the
    context (and so attention per token) grows."""
    chunks, done = [], 0
    while done < tokens:
        n = cost.chunk_for_budget(done, tokens - done, budget_s, min_chunk)
        chunks.append(n)
        done += n
    return tuple(chunks)


def choose_prefill(
    cands: Sequence[Candidate],
    tokens: int,
    cost: QuadraticCost,
    bounds: Sequence[int],
    budget_s: float,
    min_chunk: int,
) -> PrefillPlan:
    """The engine that finishes the request first: queued seconds plus the request's chunked time."""
    chunks = plan_chunks(max(tokens, 1), cost, budget_s, min_chunk)
    starts = [sum(chunks[:k]) for k in range(len(chunks))]
    seconds = sum(cost.chunk_time(s, n) for s, n in zip(starts, chunks, strict=True))
    room = [i for i, c in enumerate(cands) if not _full(c)] or list(range(len(cands)))
    best = min(room, key=lambda i: (cands[i].backlog_s + seconds, cands[i].batch, i))
    return PrefillPlan(best, context_bucket(tokens, bounds), chunks, seconds)


def choose_least_requests(cands: Sequence[Candidate]) -> int:
    return min(range(len(cands)), key=lambda i: (cands[i].batch, i))


def rendezvous(key: str, cands: Sequence[Candidate]) -> int:
    """Highest-random-weight hashing: the engine a key maps to, stable while the pool changes."""

    def weight(i: int) -> bytes:
        return hashlib.blake2b(f"{cands[i].name}|{key}".encode(), digest_size=8).digest()

    return max(range(len(cands)), key=weight)


def with_affinity(
    chosen: int, preferred: int, cands: Sequence[Candidate], tokens: int, kv_per_seq: float, slack: float
) -> int:
    """`preferred` (the prefix's engine) unless its cost exceeds the chosen one's by more than `slack`."""
    cost = [
        decode_cost(c.batch + 1, c.kv_tokens + tokens, kv_per_seq) for c in (cands[chosen], cands[preferred])
    ]
    return preferred if not _full(cands[preferred]) and cost[1] <= cost[0] * (1 + slack) else chosen
