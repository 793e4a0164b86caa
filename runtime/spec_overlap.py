"""Zero-overhead scheduling with DSpark drafting on: the device runs step N+1 while the host commits
step N (detokenization, stop strings, events).

A verify step's rows are the drafts of the step before and their number is the confidence planner's
choice over those drafts' confidences, so step N+1 can only be planned once step N is verified and
drafted; planning it from older drafts would change which drafts are verified, and with them a seeded
request's tokens. What overlaps instead is everything after the plan: one `SpecOverlap.step()`, with
step N submitted by the previous call,
1. waits for step N (`ModelRunner.wait`: verify, record, draft the requests that go on);
2. one native call (`Scheduler.advance`) commits N's emitted tokens and plans N+1, exactly as a plain
   step does;
3. submits N+1 (its forward is queued on the device);
4. detokenizes N's tokens, checks stop strings and returns N's events while N+1 runs.
The plans, and so every token, are those of the plain drafting engine: a request that a stop string
ends in step 4 is in N+1's plan in both (a plain step plans before it detokenizes too), its rows are
discarded. A call therefore returns its own step's events, and the host gap between two target steps
loses the commit work. Steps whose inputs depend on the commit (prefill truncation of a prefill chunk
reads the request's tokens) and the first step after an idle engine run as plain steps. The loop drives
the runner's `submit` / `wait` itself and the engine's step phases for the rest (`Engine.take_plan`,
`begin_step`, `commit_step`, `finish_step`: runtime/engine.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsgraph.runtime.model_runner import Launched

if TYPE_CHECKING:
    from dsgraph.runtime.engine import Engine, TokenEvent
    from dsgraph.runtime.scheduler import StepPlan

__all__ = ["SpecOverlap"]


class SpecOverlap:
    """The overlapped drafting loop of one Engine (see the module doc)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.flight: Launched | None = None  # the step submitted by the previous call

    @property
    def busy(self) -> bool:
        return self.flight is not None

    def step(self) -> list[TokenEvent]:
        e = self.engine
        if self.flight is None:
            plan = e.take_plan()
            if plan.bucket == 0 or not e.scheduler.has_unfinished or self._needs_plain(plan):
                return e.run_plain(plan)
            if not self._submit(plan):
                return e.run_plain(plan)  # its failure is handled (and its requests failed) there
        launched, self.flight = self.flight, None
        assert launched is not None
        plan = launched.plan
        if not e.scheduler.has_unfinished:  # every request of the step ended meanwhile
            e.skip_step(plan)
            return []
        try:
            out = e.runner.wait(launched)
        except Exception as exc:  # the step's requests fail; the engine and everyone else go on
            return e.fail_step(plan, exc)
        committed = e.commit_step(out)
        nxt = e.take_plan()  # the commit made it
        if (
            nxt.bucket == 0
            or not e.scheduler.has_unfinished
            or self._needs_plain(nxt)
            or not self._submit(nxt)
        ):
            e.hold_plan(nxt)  # the next call runs it as a plain step
        return e.finish_step(committed)

    def _submit(self, plan: StepPlan) -> bool:
        """Launch `plan`; False (nothing held) when its submission failed, for a plain step to redo."""
        try:
            self.flight = self.engine.runner.submit(plan)
        except Exception:
            return False
        self.engine.begin_step(plan)
        return True

    def _needs_plain(self, plan: StepPlan) -> bool:
        """Prefill truncation keeps a prompt suffix measured from the request's tokens so far, which the
        step in commit may still change: such steps wait for the commit."""
        return self.engine.truncation is not None and plan.num_decode < plan.num_seqs
