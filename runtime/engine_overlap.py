"""Zero-overhead (overlapped) scheduling: the device runs step N+1 while the host commits step N,
detokenizes it and plans step N+2.

One `OverlapLoop.step()`, with plan P(N+1) made by the previous call and step N running:
1. launch N+1: its inputs are staged (one host-to-device copy), the rows whose token is step N's sample
   (`StepPlan.token_src`, planned before that token was known) take it from N's sample tensor on the
   device (`runtime/input_fix.py`), the captured step replays, sampling runs on the device and its small
   results start back to pinned host memory (one non-blocking copy per tensor and an event);
2. wait for step N's results: the event of step 1 of the previous call, the one host sync of the step;
3. one native call (`Scheduler.advance_ahead`): commit N with its tokens (eos, stop tokens; a request
   that stopped loses its row in N+1, and its caches are freed once N+1 is done), commit N+1 ahead of
   its tokens (length limits are known: such a request is not planned again), plan N+2;
4. detokenize N's tokens, check stop strings, return N's events.
So a step's tokens come back one call later; a final call with nothing left to plan drains (flushes) the
last step. A request added between calls joins the plan made by the next call, two calls later.
The loop drives the runner itself (`ModelRunner.launch_sampled`, the pending copies) and the engine's
step phases for the rest (`Engine.take_plan`, `begin_step`, `commit_ahead`, `resolve_ahead`,
`finish_step`: runtime/engine.py).

Steps with prompt-logprob rows or teacher-forced tokens (`golden_token_ids`) run without overlap: the
step in flight is resolved first (a second native call; its invalid rows fail there as in an overlapped
commit), then the step runs, is sampled, read and committed as in `Engine.run_plain`. A row whose
logits hold NaN/+inf or whose sampled id is outside the vocabulary fails its request alone, as in plain
steps (runtime/row_checks.py). With DSpark drafting on, `SpecOverlap` (runtime/spec_overlap.py)
overlaps differently: a verify step's rows depend on the drafts of the step before, so it plans each
step after the one before it is verified and drafted, and overlaps the host's commit work instead.
Prefill chunks overlap like decode rows: their tokens are known on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsgraph.runtime.input_fix import InputFix
from dsgraph.runtime.sampler import PendingSamples, SampleCopies, Samples
from dsgraph.runtime.spec_overlap import SpecOverlap

__all__ = ["Flight", "OverlapLoop", "SpecOverlap", "resolve_overlap"]

if TYPE_CHECKING:
    from dsgraph.runtime.engine import Engine, EngineConfig, TokenEvent
    from dsgraph.runtime.scheduler import StepPlan


def resolve_overlap(config: EngineConfig, drafting: bool) -> bool:
    """Whether a NORMAL or PROMPT engine overlaps steps: "auto" on platform cuda (with DSpark drafting
    too: the `SpecOverlap` loop of runtime/spec_overlap.py; on a PROMPT engine the planning it hides
    outweighs the export's wait for the device, docs/pd.md)."""
    if config.scheduler.overlap == "auto":
        return config.platform == "cuda"
    return config.scheduler.overlap == "on"


@dataclass
class Flight:
    """A step committed ahead of its tokens: launched (samples on the device, on their way to the host)
    or not run (every request in it had ended; its tokens are never read)."""

    plan: StepPlan
    samples: Samples | None = None
    pending: PendingSamples | None = None

    def host(self) -> Samples | None:
        """Its samples on the host (waits for them); None when it did not run."""
        return None if self.pending is None else self.pending.wait()


class OverlapLoop:
    """The overlapped engine loop of one Engine (see the module doc)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.flight: Flight | None = None  # the step committed ahead, whose tokens are not read yet
        self.copies = SampleCopies()

    @property
    def busy(self) -> bool:
        return self.flight is not None

    def step(self) -> list[TokenEvent]:
        e = self.engine
        plan = e.take_plan()
        if self.flight is None and plan.bucket == 0:
            return e.run_plain(plan)  # nothing runs or waits: pending aborts only
        if plan.bucket > 0 and self._needs_plain(plan):
            return self._plain(plan)
        launched, failed = self._launch(plan)
        prev, self.flight = self.flight, launched
        host = prev.host() if prev is not None else None
        committed = e.commit_ahead(prev.plan if prev is not None else None, host)
        return failed + e.finish_step(committed)

    def _launch(self, plan: StepPlan) -> tuple[Flight | None, list[TokenEvent]]:
        """Run and sample `plan` on the device without waiting for anything; (its flight, events of
        requests that failed in it)."""
        e = self.engine
        if plan.bucket == 0:
            return None, []
        rids = [int(r) for r in plan.seq_rids[: plan.num_seqs]]
        if all(r not in e.live or e.live[r].finish is not None for r in rids):
            return Flight(plan), []  # every request ended: nothing to run
        e.begin_step(plan)
        try:
            prev = self.flight.samples if self.flight is not None else None
            s = e.runner.launch_sampled(plan, InputFix.of(plan, None if prev is None else prev.tokens))
        except Exception as exc:  # the step's requests fail; the engine and everyone else go on
            return Flight(plan), e.fail_requests(plan, exc)
        return Flight(plan, s, self.copies.start(s)), []

    def _needs_plain(self, plan: StepPlan) -> bool:
        """Prompt logprobs are read off the step's logits, a forced token must reach the next step's
        inputs, the min_tokens mask counts the tokens so far, and a grammar's mask needs the previous token:
        such steps run without overlap."""
        e = self.engine
        if e.runner.prompt_rows(plan)[0] or e.runner.min_tokens_rows(plan):
            return True
        for rid in plan.sample_rids.tolist():
            live = e.live.get(rid)
            # a token of the step in flight may not be counted yet: forcing may start one row later
            if live is not None and len(live.tokens) < len(live.params.golden_token_ids):
                return True
        # a constrained row's mask follows the grammar through the token of the step in flight
        return any(int(rid) in e.structured.grammars for rid in plan.sample_rids.tolist())

    def _plain(self, plan: StepPlan) -> list[TokenEvent]:
        """Resolve the step in flight, then run `plan` without overlap."""
        e = self.engine
        out: list[TokenEvent] = []
        fix = None
        if self.flight is not None:
            prev, self.flight = self.flight, None
            out = e.finish_step(e.resolve_ahead(prev.plan, prev.host()))
            fix = InputFix.of(plan, None if prev.samples is None else prev.samples.tokens)
        return out + e.run_plain(plan, fix)
