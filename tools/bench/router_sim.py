"""The router's decode policies at scale: thousands of engines, a synthetic trace with a long-tailed
context mix, and the balance efficiency each policy reaches against a perfectly balanced schedule.

Model. Engines decode in lockstep groups (DP attention with expert parallelism: every rank of a group
waits for the slowest at each MoE exchange), so a group's step takes the longest of its members' step
times t = alpha + beta*batch + gamma*kv. A perfectly balanced offline schedule gives every member the
group's mean work, so its step takes the mean; balance efficiency = sum over steps of the mean member
time / sum of the longest. Requests arrive (Poisson) with a context drawn from DeepSeek's buckets and an
output length (lognormal, unknown to the router), are placed at arrival by the policy over all engines,
queue on their engine while its batch is full, and leave when their output is done. The router sees each
engine's load as polled `poll_steps` ago plus what it placed since (as runtime/router/pool.py does)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from dsgraph.runtime.router import policy as P

# context mix over DeepSeek's prefill buckets (< 16K, 16-64K, 64-256K, >= 256K): fraction, range
CONTEXT_MIX = (
    (0.62, 512, 16_384),
    (0.25, 16_384, 65_536),
    (0.10, 65_536, 262_144),
    (0.03, 262_144, 1_000_000),
)


@dataclass(frozen=True)
class DecodeSim:
    engines: int = 2048
    group: int = 32  # engines per lockstep group
    max_batch: int = 64
    steps: int = 2000
    load: float = 0.9  # arrivals as a fraction of what keeps every batch full
    output_mean: float = 400.0
    output_sigma: float = 1.0  # lognormal shape: a long tail of long answers
    alpha: float = 8e-3  # seconds per step, fixed
    beta: float = 6e-5  # seconds per sequence per step
    gamma: float = 1.5e-9  # seconds per KV token per step (sparse attention reads a bounded top-k)
    poll_steps: int = 20  # how stale the polled loads are
    seed: int = 0


def sample_contexts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Context lengths from CONTEXT_MIX, log-uniform within each bucket."""
    fracs = np.array([m[0] for m in CONTEXT_MIX])
    which = rng.choice(len(CONTEXT_MIX), size=n, p=fracs / fracs.sum())
    lo = np.log(np.array([m[1] for m in CONTEXT_MIX]))[which]
    hi = np.log(np.array([m[2] for m in CONTEXT_MIX]))[which]
    return np.exp(lo + (hi - lo) * rng.random(n)).astype(np.int64)


def sample_outputs(rng: np.random.Generator, n: int, mean: float, sigma: float) -> np.ndarray:
    mu = np.log(mean) - sigma * sigma / 2
    return np.maximum(1, rng.lognormal(mu, sigma, n)).astype(np.int64)


class _Engines:
    """Batch, KV and the queue of every engine; running requests as flat arrays."""

    def __init__(self, sim: DecodeSim, capacity: int) -> None:
        self.sim = sim
        self.batch = np.zeros(sim.engines, np.int64)
        self.kv = np.zeros(sim.engines, np.int64)
        self.queues: list[deque[tuple[int, int]]] = [deque() for _ in range(sim.engines)]
        self.queued = np.zeros(sim.engines, np.int64)  # requests and context tokens waiting
        self.queued_kv = np.zeros(sim.engines, np.int64)
        self.eng = np.full(capacity, -1, np.int64)  # per running slot: engine, tokens left, context
        self.left = np.zeros(capacity, np.int64)
        self.ctx = np.zeros(capacity, np.int64)
        self.free = list(range(capacity))

    def admit(self, e: int, ctx: int, out: int) -> None:
        if self.batch[e] >= self.sim.max_batch:
            self.queues[e].append((ctx, out))
            self.queued[e] += 1
            self.queued_kv[e] += ctx
            return
        slot = self.free.pop()
        self.eng[slot], self.left[slot], self.ctx[slot] = e, out, ctx
        self.batch[e] += 1
        self.kv[e] += ctx

    def step(self) -> None:
        """One decode step everywhere: every running request adds a token; finished ones leave and
        queued ones take their places."""
        live = self.eng >= 0
        self.left[live] -= 1
        self.ctx[live] += 1
        np.add.at(self.kv, self.eng[live], 1)
        done = np.flatnonzero(live & (self.left <= 0))
        np.subtract.at(self.batch, self.eng[done], 1)
        np.subtract.at(self.kv, self.eng[done], self.ctx[done])
        touched = set(self.eng[done].tolist())
        self.eng[done] = -1
        self.free.extend(done.tolist())
        for e in touched:
            while self.queues[e] and self.batch[e] < self.sim.max_batch:
                ctx, out = self.queues[e].popleft()
                self.queued[e] -= 1
                self.queued_kv[e] -= ctx
                self.admit(e, ctx, out)


def _choose(
    policy: str, seen_b: np.ndarray, seen_kv: np.ndarray, ctx: int, k: int, rng, sim: DecodeSim
) -> int:  # type: ignore[no-untyped-def]
    if policy == "round_robin":
        return k % len(seen_b)
    if policy == "random":
        return int(rng.integers(len(seen_b)))
    if policy == "least_requests":
        return int(np.argmin(seen_b))
    # the router's decode policy (P.choose_decode), vectorized: least step cost after adding, full
    # engines only when all are
    cost = P.decode_cost(seen_b + 1, seen_kv + ctx, sim.beta / sim.gamma)
    full = seen_b >= sim.max_batch
    if not full.all():
        cost = np.where(full, np.inf, cost)
    return int(np.argmin(cost))


def run_decode(sim: DecodeSim, policy: str) -> dict[str, float]:
    rng = np.random.default_rng(sim.seed)
    rate = sim.load * sim.engines * sim.max_batch / sim.output_mean  # arrivals per step
    warm = sim.steps // 2  # the first half fills the engines; efficiency is measured after it
    arrivals = rng.poisson(rate, sim.steps)
    total = int(arrivals.sum()) + 1
    ctxs, outs = sample_contexts(rng, total), sample_outputs(rng, total, sim.output_mean, sim.output_sigma)
    eng = _Engines(sim, sim.engines * sim.max_batch)
    seen_b, seen_kv = np.zeros(sim.engines), np.zeros(sim.engines)
    k, sum_mean, sum_max, batches = 0, 0.0, 0.0, []
    for step in range(sim.steps):
        if step % sim.poll_steps == 0:
            seen_b = (eng.batch + eng.queued).astype(np.float64)
            seen_kv = (eng.kv + eng.queued_kv).astype(np.float64)
        for _ in range(arrivals[step]):
            e = _choose(policy, seen_b, seen_kv, int(ctxs[k]), k, rng, sim)
            eng.admit(e, int(ctxs[k]), int(outs[k]))
            seen_b[e] += 1
            seen_kv[e] += ctxs[k]
            k += 1
        t = sim.alpha + sim.beta * eng.batch + sim.gamma * eng.kv
        groups = t.reshape(-1, sim.group)
        if step >= warm:
            sum_mean += float(groups.mean(axis=1).sum())
            sum_max += float(groups.max(axis=1).sum())
            batches.append(float(eng.batch.mean()))
        eng.step()
    return {
        "efficiency": sum_mean / sum_max,
        "mean_batch": float(np.mean(batches)),
        "queued_at_end": int(eng.queued.sum()),
    }
