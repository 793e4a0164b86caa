"""Which engine(s) a request goes to: the configured policy over the pool's available engines.

Normal engines prefill and decode, so the decode policy places the request (its prompt becomes KV
there) and the prefill plan only sizes its chunks. With prompt and completion engines both policies
apply: a prompt engine for the prefill, a completion engine for the decode (pd.py)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Collection
from dataclasses import dataclass

from dsgraph.runtime.router import policy as P
from dsgraph.runtime.router.config import RouterConfig
from dsgraph.runtime.router.cost import OnlineCost, QuadraticCost
from dsgraph.runtime.router.pool import EngineState, Pool

# The prior until enough requests are measured: a tiny model's order of magnitude on a CPU; `dsgraph
# router --prefill-cost A,B,C` sets a measured one.
DEFAULT_PRIOR = QuadraticCost(a=0.01, b=2e-5, c=1e-10)


@dataclass(frozen=True)
class Choice:
    engine: EngineState  # where the request is sent (a normal or a completion engine)
    prefill: EngineState | None  # the prompt engine of a PD pair
    plan: P.PrefillPlan


class NoEngine(Exception):
    """No engine of the needed role is available."""


class Selector:
    def __init__(self, cfg: RouterConfig, pool: Pool, prior: QuadraticCost = DEFAULT_PRIOR) -> None:
        self.cfg, self.pool = cfg, pool
        self.cost = OnlineCost(prior)
        # a counter per pick: a pair's two picks sharing one would take every other turn each, so with
        # two engines of each role round robin would use one prompt and one completion engine only
        self._rr = {True: itertools.count(), False: itertools.count()}  # by `prefill`
        self._random = random.Random(cfg.seed)

    @property
    def is_pd(self) -> bool:
        return bool(self.cfg.prefill)

    def choose(self, tokens: int, prefix: str, exclude: Collection[str] = ()) -> Choice:
        if self.is_pd:
            prefill = self._pick(self._engines("prefill", exclude), tokens, prefix, prefill=True)
            decode = self._pick(self._engines("decode", exclude), tokens, prefix, prefill=False)
            return Choice(decode, prefill, self._plan([prefill], tokens))
        engine = self._pick(self._engines("normal", exclude), tokens, prefix, prefill=False)
        return Choice(engine, None, self._plan([engine], tokens))

    def _engines(self, role: str, exclude: Collection[str]) -> list[EngineState]:
        engines = [e for e in self.pool.available(role) if e.url not in exclude]
        if not engines:
            raise NoEngine(f"no {role} engine is available (healthy, not draining, not tried already)")
        return engines

    def _plan(self, engines: list[EngineState], tokens: int) -> P.PrefillPlan:
        cfg = self.cfg
        cands = [e.candidate() for e in engines]
        return P.choose_prefill(
            cands, tokens, self.cost.model, cfg.context_buckets, cfg.prefill_budget_s, cfg.min_chunk_tokens
        )

    def _pick(self, engines: list[EngineState], tokens: int, prefix: str, prefill: bool) -> EngineState:
        cfg = self.cfg
        if cfg.policy == "round_robin":
            return engines[next(self._rr[prefill]) % len(engines)]
        if cfg.policy == "random":
            return self._random.choice(engines)
        cands = [e.candidate() for e in engines]
        if cfg.policy == "least_requests":
            return engines[P.choose_least_requests(cands)]
        if prefill:
            return engines[self._plan(engines, tokens).index]
        index = P.choose_decode(cands, tokens, cfg.kv_per_seq, next(self._rr[False]))
        if cfg.prefix_affinity and prefix:
            preferred = P.rendezvous(prefix[: cfg.affinity_prefix_chars], cands)
            index = P.with_affinity(index, preferred, cands, tokens, cfg.kv_per_seq, cfg.affinity_slack)
        return engines[index]
