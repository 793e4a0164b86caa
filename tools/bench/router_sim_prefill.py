"""The router's prefill policy at scale, and whether prefix affinity still pays when the KV store is
shared.

Model. Prefill engines run in lockstep groups; each step an engine prefills up to `budget_s` of work
(chunks sized by the cost model fill it), FIFO. A request's work is the true quadratic cost of its
uncached tokens: b*(L-p) + c*(L^2-p^2) for a cached prefix of p tokens. Half the requests continue an
earlier session whose prefix was prefilled before: on the engine that served it the prefix is a local
hit (free); elsewhere it is a shared-store hit (loading it costs `fetch_ratio` of computing it) or, with
no shared store, computed again. The router estimates work with a model fitted to noisy step times and
sees backlogs polled `poll_steps` ago plus its own placements since. Balance efficiency per step and
group = the mean member's work / the busiest member's (what a perfectly balanced schedule reaches: 1)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from dsgraph.runtime.router.cost import QuadraticCost, fit_quadratic
from dsgraph.tools.bench.router_sim import sample_contexts

PREFILL_POLICIES = ("round_robin", "least_requests", "cost_model", "cost_model+affinity")


@dataclass(frozen=True)
class PrefillSim:
    engines: int = 1024
    group: int = 16
    steps: int = 1500
    load: float = 0.85  # offered work as a fraction of the engines' capacity
    budget_s: float = 0.25
    a: float = 0.005
    b: float = 2.5e-5  # 40K tokens/s of linear work
    c: float = 1e-10  # attention: at 250K tokens as much as the linear part
    fit_noise: float = 0.05  # relative noise of the step times the router fits
    session_frac: float = 0.5
    prefix_frac: float = 0.9  # of a continuing request's context, the part prefilled before
    fetch_ratio: float = 0.02  # loading a shared-store hit costs this fraction of computing it
    shared_store: bool = True
    affinity_slack_s: float = 0.5  # affinity keeps a request on its session's engine within this backlog
    poll_steps: int = 4
    seed: int = 0


def _work(cost: QuadraticCost, length: np.ndarray, cached: np.ndarray) -> np.ndarray:
    return cost.b * (length - cached) + cost.c * (
        length.astype(np.float64) ** 2 - cached.astype(np.float64) ** 2
    )


def fitted_model(sim: PrefillSim, rng: np.random.Generator) -> QuadraticCost:
    """What the router fits from 256 measured prefill times with `fit_noise` relative noise."""
    lengths = sample_contexts(rng, 256)
    true = sim.a + sim.b * lengths + sim.c * lengths.astype(np.float64) ** 2
    noisy = true * (1 + sim.fit_noise * rng.standard_normal(len(true)))
    return fit_quadratic(zip(lengths.tolist(), noisy.tolist(), strict=True))


def _trace(sim: PrefillSim, rng: np.random.Generator, true: QuadraticCost):  # type: ignore[no-untyped-def]
    """Arrivals per step, contexts, cached prefix lengths and session ids."""
    probe = sample_contexts(rng, 4096)
    mean_work = float(_work(true, probe, np.zeros_like(probe)).mean())
    if sim.shared_store:  # cached prefixes cut the work roughly by this much (the quadratic part exactly)
        mean_work *= 1 - sim.session_frac * (1 - (1 - sim.prefix_frac) ** 2)
    rate = sim.load * sim.engines * sim.budget_s / mean_work
    arrivals = rng.poisson(rate, sim.steps)
    n = int(arrivals.sum())
    ctx = sample_contexts(rng, n)
    cont = rng.random(n) < sim.session_frac
    cached = np.where(cont, (ctx * sim.prefix_frac).astype(np.int64), 0)
    sessions = np.arange(n)
    # a continuing request belongs to an earlier one's session (uniform over the earlier requests)
    earlier = (rng.random(n) * np.arange(n)).astype(np.int64)
    sessions[cont] = earlier[cont]
    return arrivals, ctx, cached, sessions


def run_prefill(sim: PrefillSim, policy: str) -> dict[str, float]:
    rng = np.random.default_rng(sim.seed)
    true = QuadraticCost(sim.a, sim.b, sim.c)
    model = fitted_model(sim, rng)
    arrivals, ctx, cached, sessions = _trace(sim, rng, true)
    backlog = np.zeros(sim.engines)
    seen = np.zeros(sim.engines)
    queued = np.zeros(sim.engines)  # requests placed and not done (least_requests)
    ends: list[deque[float]] = [deque() for _ in range(sim.engines)]  # cumulative work at which each ends
    consumed = np.zeros(sim.engines)
    home = np.full(len(ctx), -1, np.int64)  # per session: the engine holding its prefix locally
    ttft, work_done, k = [], 0.0, 0
    sum_mean = sum_max = 0.0
    for step in range(sim.steps):
        if step % sim.poll_steps == 0:
            seen = backlog.copy()
        for _ in range(arrivals[step]):
            e, w = _place(sim, policy, k, seen, queued, home, sessions, ctx, cached, model, true)
            ttft.append(backlog[e] + w)  # FIFO at one second of work per second
            backlog[e] += w
            ends[e].append(consumed[e] + backlog[e])
            seen[e] += w
            queued[e] += 1
            home[sessions[k]] = e
            work_done += w
            k += 1
        used = np.minimum(backlog, sim.budget_s)
        groups = used.reshape(-1, sim.group)
        busy = groups.max(axis=1) > 0
        sum_mean += float(groups.mean(axis=1)[busy].sum())
        sum_max += float(groups.max(axis=1)[busy].sum())
        backlog -= used
        consumed += used
        for e in np.flatnonzero(used).tolist():
            while ends[e] and ends[e][0] <= consumed[e] + 1e-12:
                ends[e].popleft()
                queued[e] -= 1
    t = np.asarray(ttft)
    return {
        "efficiency": sum_mean / sum_max,
        "ttft_mean_s": float(t.mean()),
        "ttft_p99_s": float(np.percentile(t, 99)),
        "work_per_request_s": work_done / max(k, 1),
        "fit": model.as_text(),
    }


def _place(sim, policy, k, seen, queued, home, sessions, ctx, cached, model, true):  # type: ignore[no-untyped-def]
    """(engine, true work there) for request k."""
    prev = home[sessions[k]] if cached[k] else -1
    if policy == "round_robin":
        e = k % sim.engines
    elif policy == "least_requests":
        e = int(np.argmin(queued))
    else:
        est = _request_work(sim, model, ctx[k], cached[k], local=False)
        e = int(np.argmin(seen + est))
        if policy == "cost_model+affinity" and prev >= 0 and seen[prev] <= seen[e] + sim.affinity_slack_s:
            e = int(prev)
    return e, _request_work(sim, true, ctx[k], cached[k], local=e == prev)


def _request_work(sim: PrefillSim, cost: QuadraticCost, length: int, cached: int, local: bool) -> float:
    if cached == 0 or local:
        return float(_work(cost, np.array([length]), np.array([cached]))[0])
    if not sim.shared_store:
        return float(_work(cost, np.array([length]), np.array([0]))[0])
    fetch = sim.fetch_ratio * float(_work(cost, np.array([cached]), np.array([0]))[0])
    return float(_work(cost, np.array([length]), np.array([cached]))[0]) + fetch
