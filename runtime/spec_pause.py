"""Whether drafting pays (issue 6): the draft pass's cost per bucket of sequences, and the per-step
decision to skip it when the realised acceptance does not buy back its time.

A drafting engine spends, per step, the verify step `curve(N + T)` plus the draft pass `draft_ms(N)`
that prepares the next step, for N + (expected accepted drafts) tokens; without drafting it spends
`curve(N)` for N tokens. `DraftPause.decide` compares the two rates each step from the global
per-position conditional acceptance rates realised so far (an exponential moving average per draft
position; positions not yet verified take the mean confidence of the newest drafts), the planner's best
allocation with the draft pass as the cost of drafting (`plan_verification(..., draft_ms=...)`, which
verifies nothing when no drafting plan beats plain decode). When drafting does not pay the draft pass
is skipped (the requests go on as plain decode rows, whose tokens are the same by construction) for 1,
2, 4, ... up to `max_backoff` steps; after each pause one probe pass drafts unconditionally so that a
change in acceptance is noticed, and a decision that pays resets the backoff.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dsgraph.runtime.spec_schedule import ThroughputCurve, plan_rate, plan_verification
from dsgraph.runtime.step_padding import bucket_size

__all__ = ["DraftCost", "DraftCosts", "DraftPause", "PauseConfig"]


class DraftCost:
    """Draft pass time (ms) per bucket of sequences (the drafter pads to the next power of two), by
    draft depth where a point gives one time per depth (a DSpark pass drafts its whole block at once:
    one time covers every depth).

    `ms` holds the full-depth pass per bucket, `shape` the shallower depths as fractions of it. `given`
    points are used as they are (a benchmark's numbers, or tests); otherwise the profiled points seed
    the table and every measured pass (a full-depth pass) moves its bucket's estimate by `alpha` toward
    it (the first measurement of an unprofiled bucket replaces nothing). A bucket without an estimate
    takes the nearest larger known one, else the largest known; None when nothing is known yet."""

    def __init__(
        self,
        points: Mapping[int, float | Sequence[float]] | None = None,
        *,
        fixed: bool = False,
        alpha: float = 0.2,
    ):
        if not 0 < alpha <= 1:
            raise ValueError(f"DraftCost.alpha = {alpha}, expected a value in (0, 1]")
        self.ms: dict[int, float] = {}
        self.shape: dict[int, list[float]] = {}
        for n, t in (points or {}).items():
            depths = [float(x) for x in t] if isinstance(t, tuple | list) else [float(t)]
            b = bucket_size(n)
            self.ms[b] = depths[-1]
            self.shape[b] = [x / depths[-1] if depths[-1] > 0 else 1.0 for x in depths]
        self.fixed, self.alpha = fixed, alpha

    def _bucket(self, seqs: int) -> int | None:
        if not self.ms:
            return None
        b = bucket_size(seqs)
        larger = [k for k in sorted(self.ms) if k >= b]
        return larger[0] if larger else max(self.ms)

    def predict(self, seqs: int) -> float | None:
        """The full-depth pass for `seqs` sequences (None: nothing known)."""
        b = self._bucket(seqs)
        return None if b is None else self.ms[b]

    def by_depth(self, seqs: int) -> list[float]:
        """The pass for `seqs` sequences by depth 1, 2, ... (the planner's `draft_ms`); empty when
        nothing is known yet (drafting is then assumed free: its first pass measures it)."""
        b = self._bucket(seqs)
        return [] if b is None else [self.ms[b] * f for f in self.shape.get(b, [1.0])]

    def observe(self, seqs: int, measured_ms: float) -> None:
        if self.fixed or not math.isfinite(measured_ms) or measured_ms < 0:
            return
        b = bucket_size(seqs)
        old = self.ms.get(b)
        self.ms[b] = measured_ms if old is None else old + self.alpha * (measured_ms - old)


@dataclass
class DraftCosts:
    """The draft pass's cost by drafter variant (runtime/spec_draft.py): a pass of greedy requests only
    runs the greedy variant, any other the full graph, whose sorted sampling of the vocabulary per slot
    takes several times longer (3.5x at batch 1 on an H100, bench spec part). Each variant is priced and
    measured on its own table; `greedy` None: one table for both (a given draft_cost, or a drafter
    without the variant). A variant whose table knows nothing yet is priced by the full graph's."""

    full: DraftCost
    greedy: DraftCost | None = None

    def pricing(self, greedy: bool) -> DraftCost:
        """The table that predicts a pass of this variant."""
        return self.greedy if greedy and self.greedy is not None and self.greedy.ms else self.full

    def measuring(self, greedy: bool) -> DraftCost:
        """The table a measured pass of this variant updates."""
        return self.greedy if greedy and self.greedy is not None else self.full


@dataclass(frozen=True)
class PauseConfig:
    max_backoff: int = 64  # the longest pause (steps) between probes
    alpha: float = 0.2  # weight of a step's realised rate in the moving average

    def __post_init__(self) -> None:
        if self.max_backoff < 1:
            raise ValueError(f"PauseConfig.max_backoff = {self.max_backoff}, expected >= 1")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"PauseConfig.alpha = {self.alpha}, expected a value in (0, 1]")


class DraftPause:
    """The per-step draft-or-skip decision (module doc); counts paused steps and probes."""

    def __init__(
        self, curve: ThroughputCurve, costs: DraftCosts, nextn: int, config: PauseConfig = PauseConfig()
    ) -> None:
        self.curve, self.costs, self.nextn, self.config = curve, costs, nextn, config
        self.rate = np.full(nextn, np.nan)  # realised conditional acceptance per position (EMA)
        self.seed = np.ones(nextn)  # mean confidences of the newest drafts (optimistic before any)
        self.backoff, self.skip_left, self.probe = 1, 0, False
        self.paused_steps = self.probes = 0
        self.last_probe = False  # whether the last decision was a probe (its drafts are verified)

    def observe(self, verified: Sequence[int], accepted: Sequence[int]) -> None:
        """One verify step: drafts verified and accepted per sequence. Position j is reached when the
        first j drafts were accepted and j < verified; it succeeds when j < accepted."""
        reached, passed = np.zeros(self.nextn), np.zeros(self.nextn)
        for n, a in zip(verified, accepted, strict=True):
            top = min(a + 1, n, self.nextn)
            reached[:top] += 1
            passed[: min(a, top)] += 1
        seen = reached > 0
        rate = np.divide(passed, reached, out=np.zeros(self.nextn), where=seen)
        fresh = seen & np.isnan(self.rate)
        self.rate[fresh] = rate[fresh]
        old = seen & ~fresh
        self.rate[old] += self.config.alpha * (rate[old] - self.rate[old])

    def seed_confidences(self, conf: np.ndarray, lengths: np.ndarray) -> None:
        """The newest drafts' confidences [seqs, nextn] (held lengths): the estimate of unseen positions."""
        for j in range(self.nextn):
            held = lengths > j
            if held.any():
                self.seed[j] = float(conf[held, j].mean())

    def estimate(self) -> np.ndarray:
        return np.where(np.isnan(self.rate), self.seed, self.rate)

    def rates(self, seqs: int, greedy: bool = False) -> tuple[float, float]:
        """Predicted tokens per ms (drafting every step, without drafting) for `seqs` decode sequences,
        the pass priced as the `greedy` variant or the full graph. Drafting's rate is its best plan's
        (`plan_verification` charges the draft pass to plans that verify drafts); when that plan
        verifies nothing, drafting would pay the pass for no draft."""
        n = min(seqs, self.curve.largest)
        conf = np.tile(self.estimate(), (n, 1))
        cost = self.costs.pricing(greedy)
        plan = plan_verification(conf, self.curve, n * self.nextn, draft_ms=cost.by_depth(seqs))
        without = n / self.curve.predict(n)
        if plan.total_drafts == 0:
            return n / (self.curve.predict(n) + (cost.predict(seqs) or 0.0)), without
        return plan_rate(plan), without

    def decide(self, seqs: int, greedy: bool = False) -> bool:
        """Whether to run the draft pass (the `greedy` variant or the full graph) for `seqs` sequences
        going on to the next step."""
        self.last_probe = False
        if self.skip_left > 0:
            self.skip_left -= 1
            self.paused_steps += 1
            self.probe = self.skip_left == 0
            return False
        if self.probe:
            self.probe = False
            self.probes += 1
            self.last_probe = True
            return True
        with_drafts, without = self.rates(seqs, greedy)
        if with_drafts > without:
            self.backoff = 1
            return True
        self.paused_steps += 1
        self.skip_left = self.backoff - 1
        self.probe = self.skip_left == 0
        self.backoff = min(2 * self.backoff, self.config.max_backoff)
        return False

    def snapshot(self) -> dict[str, object]:
        est = self.estimate()
        return {
            "paused_steps": self.paused_steps,
            "draft_probes": self.probes,
            "draft_backoff": self.backoff,
            "realised_conditional_rate": [None if math.isnan(x) else float(x) for x in self.rate],
            "pause_estimate": [float(x) for x in est],
        }
