"""The model half of the engine: a `ModelRunner` holds the session, the sampler and the speculative
decoder (verification and drafting) and turns a step plan into a step output; the `Engine` keeps the
requests, detokenization, stop handling and events (runtime/engine.py).

A step is `submit` then `wait`: `submit` stages the plan's inputs and launches the target forward
(asynchronous on a device platform: it returns once the step is queued), `wait` reads its logits,
samples (or verifies the drafts and drafts for the requests that go on) and returns a `StepOutput` on
the host. Between the two the host is free, which zero-overhead scheduling uses to detokenize the
previous step while this one runs (runtime/engine_overlap.py). `launch_sampled` is the variant without
any host read, whose samples stay on the device for the next step's inputs.

What the runner needs of a request it asks the engine through `requests` (request id -> its record:
params, seed, prompt, tokens) and `seq_info` (request id -> SeqInfo, None once it has ended)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dsgraph.runtime.input_fix import InputFix
from dsgraph.runtime.prompt_logprobs import PromptEntry, mask_rows, min_tokens_mask, prompt_entries
from dsgraph.runtime.row_checks import mark_invalid, row_causes
from dsgraph.runtime.sampler import Sampler, Samples
from dsgraph.runtime.scheduler import StepPlan, model_inputs
from dsgraph.runtime.seq_info import RELEASED, SeqInfo, force_rows
from dsgraph.runtime.spec_engine import SpecDecoder

__all__ = ["Launched", "ModelRunner", "StepOutput"]


@dataclass
class Launched:
    """A submitted step: its forward is queued (or done, on the cpu platform)."""

    plan: StepPlan
    logits: torch.Tensor
    start: float  # host clock at submit
    timer: Any = None  # (start, end) device events of the forward, on a device platform
    # (request, prompt position, entry) read off the step's prompt-logprob rows
    prompt: list[tuple[int, int, PromptEntry]] = field(default_factory=list)


@dataclass
class StepOutput:
    """A step's results on the host."""

    plan: StepPlan
    samples: Samples  # per sample row: the emitted token (-1 past a speculative sequence's emission)
    num_emitted: np.ndarray | None  # [seqs] tokens each sequence emits (None without drafting)
    drafts: tuple[np.ndarray, ...] | None  # the next step's drafts (None without drafting)
    bad_rows: dict[int, str]  # sample row -> why its logits or sample are invalid (its request fails)
    verified: list[tuple[int, int, int]]  # (request, drafts verified, accepted) per decode sequence
    prompt: list[tuple[int, int, PromptEntry]]


class ModelRunner:
    """Turns step plans into step outputs (module doc)."""

    def __init__(
        self,
        session: Any,
        sampler: Sampler,
        *,
        requests: Mapping[int, Any],
        seq_info: Callable[[int], SeqInfo | None],
        eos_id: int,
        truncation: Any = None,
        structured: Any = None,
        spec: SpecDecoder | None = None,
    ) -> None:
        self.session, self.sampler, self.spec = session, sampler, spec
        self.requests, self.seq_info, self.eos_id = requests, seq_info, eos_id
        self.truncation, self.structured = truncation, structured
        self.vocab = session.model.cfg.text.vocab_size
        self.draft_depth_ms: list[float] = []  # the draft pass after the last step, for the planner
        # host gaps (ms) between target steps: from the moment step N's results are known on the host
        # to the submission of step N+1 (the bench's overlap part reads them)
        self.gaps: deque[float] = deque(maxlen=4096)
        self._ready: float | None = None

    def submit(self, plan: StepPlan, fix: InputFix | None = None) -> Launched:
        """Stage `plan`'s inputs and launch its forward. `fix`: rows whose token is a sample of the
        step before, taken from its device tensor (overlapped scheduling)."""
        start = time.perf_counter()
        if self._ready is not None:
            self.gaps.append((start - self._ready) * 1e3)
            self._ready = None
        inputs = model_inputs(plan)
        rows, meta = self.prompt_rows(plan)
        if rows:
            sample_rows = np.concatenate([np.asarray(plan.sample_rows), rows]).astype(np.int32)
            inputs = {**inputs, "sample_rows": sample_rows}
        timer = _device_timer(self.session)
        logits = self.session.run(self._truncate(plan, inputs), fix)
        if timer is not None:
            timer[1].record()
        else:  # a host platform has run the step by now
            self._ready = time.perf_counter()
        launched = Launched(plan, logits, start, timer)
        if rows:
            n = len(plan.sample_rows)
            tokens = [self.requests[rid].prompt[pos] for rid, pos in meta]
            ks = [self.requests[rid].params.prompt_logprobs or 0 for rid, _ in meta]
            entries = prompt_entries(logits[n:], tokens, ks)
            launched.prompt = [(rid, pos, e) for (rid, pos), e in zip(meta, entries, strict=True)]
            launched.logits = logits[:n]
        return launched

    def wait(self, launched: Launched) -> StepOutput:
        """Sample (or verify and draft) the submitted step; its results on the host."""
        plan = launched.plan
        logits = mask_rows(launched.logits, self.min_tokens_rows(plan))
        seqs = [self.seq_info(int(r)) for r in plan.seq_rids[: plan.num_seqs]]
        if self.spec is None:
            s = self._sample(plan, logits, seqs)
            if launched.timer is not None:  # the samples are on the host: the step is done
                self._ready = time.perf_counter()
            bad = row_causes(logits, s.tokens, self.vocab)
            s.tokens[list(bad)] = 0  # a placeholder the scheduler drops for the failed request
            return StepOutput(plan, s, None, None, bad, [], launched.prompt)
        return self._verify_and_draft(launched, logits, seqs)

    def launch_sampled(self, plan: StepPlan, fix: InputFix | None) -> Samples:
        """Run and sample `plan` on the device without any host read (overlapped scheduling); a bad
        row's token is replaced there, since it feeds the next step (runtime/row_checks.py)."""
        launched = self.submit(plan, fix)
        logits = mask_rows(launched.logits, self.min_tokens_rows(plan))
        seqs = [self.seq_info(int(r)) for r in plan.seq_rids[: plan.num_seqs]]
        return mark_invalid(logits, self._sample(plan, logits, seqs, to_host=False), self.vocab)

    def prompt_rows(self, plan: StepPlan) -> tuple[list[int], list[tuple[int, int]]]:
        """Rows whose logits give a prompt logprob: (row, (request, prompt position it predicts))."""
        rows: list[int] = []
        meta: list[tuple[int, int]] = []
        if all(lv.params.prompt_logprobs is None for lv in self.requests.values()):
            return rows, meta  # the common case: no per-row Python work on the step path
        seq_ids, positions, seq_rids = plan.seq_ids, plan.positions, plan.seq_rids
        for t in range(plan.num_tokens):
            rid = int(seq_rids[seq_ids[t]])
            live = self.requests.get(rid)
            wanted = live is not None and live.params.prompt_logprobs is not None
            if wanted and positions[t] + 1 < len(live.prompt):
                rows.append(t)
                meta.append((rid, int(positions[t]) + 1))
        return rows, meta

    def min_tokens_rows(self, plan: StepPlan) -> list[tuple[int, int]]:
        """(sample row, token id) to mask for `min_tokens` (empty in the common case: no Python work)."""
        if all(lv.params.min_tokens == 0 for lv in self.requests.values()):
            return []
        return min_tokens_mask(plan, self.requests, self.eos_id)

    def _truncate(self, plan: StepPlan, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The step's inputs with prefill truncation applied (unchanged with it off or nothing to cut)."""
        return inputs if self.truncation is None else self.truncation.apply(plan, inputs, self.requests)

    def _sample(
        self, plan: StepPlan, logits: torch.Tensor, seqs: list[SeqInfo | None], to_host: bool = True
    ) -> Samples:
        by_rid = {info.rid: info for info in seqs if info is not None}
        info = [
            by_rid.get(int(r), RELEASED) for r in plan.sample_rids
        ]  # a released abort may sit in the plan
        rows = torch.from_numpy(np.array(plan.sample_rows)).long()
        positions = torch.from_numpy(np.array(plan.positions))[rows]
        params, seeds = [i.params for i in info], [i.seed for i in info]
        allowed = None if self.structured is None else self.structured.decode_mask(plan.sample_rids)
        s = self.sampler.sample(logits, params, seeds, positions + 1, to_host=to_host, allowed=allowed)
        if allowed is not None and to_host and bool((s.tokens < 0).any()):  # fails the step, not the engine
            raise RuntimeError("a structured_outputs grammar allowed no token of the vocabulary")
        if not to_host:
            return s  # overlapped steps force nothing (engine_overlap.py)
        forced = [(k, i.forced) for k, i in enumerate(info) if i.forced is not None]
        if not forced:
            return s
        tokens, logprobs = s.tokens.clone(), s.logprobs.clone()
        force_rows(logits, [k for k, _ in forced], [t for _, t in forced], tokens, logprobs)
        return Samples(tokens, logprobs, s.top_logprobs, s.top_ids)

    def _verify_and_draft(
        self, launched: Launched, logits: torch.Tensor, seqs: list[SeqInfo | None]
    ) -> StepOutput:
        """Verify the plan's drafts, record the statistics, draft for continuing requests; the measured
        forward time corrects the throughput curve (a step larger than the curve is not a sample of it).
        A sequence with an invalid row is not drafted for (the engine fails it)."""
        spec, plan = self.spec, launched.plan
        assert spec is not None
        forward_ms = _forward_ms(launched)
        if launched.timer is not None:
            self._ready = time.perf_counter()
        v = spec.verify(plan, logits, seqs)
        bad = spec.invalid_rows(plan, logits, v)
        if bad:
            v.samples.tokens[list(bad)] = 0
            failed = {int(plan.sample_rids[i]) for i in bad}
            seqs = [None if s is None or s.rid in failed else s for s in seqs]
        curve = spec.scheduler.curve
        if curve is not None and plan.num_tokens <= curve.largest:
            curve.observe(plan.num_tokens, forward_ms)
        verified = spec.record(plan, v, spec.confidence)
        drafts = spec.draft(plan, v, seqs)
        self.draft_depth_ms = spec.next_draft_depth_ms
        return StepOutput(plan, v.samples, v.num_emitted, drafts, bad, verified, launched.prompt)


def _device_timer(session: Any) -> tuple[Any, Any] | None:
    """(start, end) events around a device forward, the start recorded now; None on the host."""
    device = getattr(session, "device", None)
    if getattr(device, "type", None) != "cuda":
        return None  # a host device (the cuda platform's code paths run on one in tests)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end


def _forward_ms(launched: Launched) -> float:
    """The forward's time: device events where it ran on a device (the host may have done other work
    meanwhile), else the host clock from submit to now."""
    if launched.timer is None:
        return (time.perf_counter() - launched.start) * 1e3
    launched.timer[1].synchronize()
    return float(launched.timer[0].elapsed_time(launched.timer[1]))
