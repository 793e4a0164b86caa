"""DSpark speculative decoding in the engine loop (issue 6): verify a step's drafts, draft for the requests
that go on, keep what the next step needs. Engine.step runs, per step:

    target forward over the plan -> `verify` (this module) -> `draft` for continuing sequences (skipped
       while drafting does not pay: `DraftPause`, runtime/spec_pause.py)
    -> Scheduler.advance(emitted tokens, num_emitted, next drafts + confidences): one native call that
       commits (stop tokens, EOS, max_tokens and max_model_len truncate an emission; the rest is
       discarded) and plans the next step (the confidence planner runs inside it)

A plan's verify sequence holds rows [newest token, d_0 .. d_{k-1}] (sample rows verify_start[s] ..
+ verify_len[s] - 1); row j's logits decide the token of position a+j+1, whose draft is d_j.

Two verification rules:
- exact speculative sampling (default): `spec_verify` (ops/spec_sampling.py) accepts d_j with
  probability min(1, p_t(d_j) / p_d(d_j)) against the draft distribution it was drawn from (the pool of
  draft log-probabilities below) and resamples the residual on rejection; the output distribution is
  the target's exactly, and greedy requests accept a draft iff it is the target's argmax.
- deterministic (`deterministic=True`): the token emitted at position p is the target's own `sample`
  draw keyed on (seed, p) on stream 0, i.e. the token a run without drafting emits there; a draft is
  accepted while it equals that draw. The drafter draws with the same key and the same method (stream
  0, inverse CDF over the processed distribution), so a draft equals the target's draw wherever the two
  distributions agree. The emitted token at every position is a function of the request's own logits at
  that position (batch-invariant on the cpu platform), its seed and the position, never of how many
  drafts were verified: a request's tokens do not depend on the batch, bucketing, chunk sizes or the
  confidence scheduling, which stays on (DeepInfer turns it off for determinism). The output
  distribution is the target's exactly, since every token is a target sample; the price is a lower
  acceptance rate for sampled requests (two coupled inverse-CDF draws agree less often than rejection
  sampling accepts), the same for greedy ones.

Draft log-probabilities stay tensors: a pool [slots, nextn, V] indexed by the request's state slot (a
request keeps its slot while it holds drafts: preemption drops them). Tests replace a sequence's drafts
(e.g. with the target's own continuation, to exercise every acceptance length) by wrapping the drafter
(tests/engine_faults.py `draft_hook`), so the drafting path holds no test hook.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dsgraph.models.interface import DRAFT_STREAM, DraftRequest
from dsgraph.runtime.row_checks import row_causes
from dsgraph.runtime.sampler import Sampler, Samples
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.scheduler import StepPlan
from dsgraph.runtime.seq_info import RELEASED, SeqInfo, force_rows
from dsgraph.runtime.spec_draft import DraftRunner
from dsgraph.runtime.spec_pause import DraftCost, DraftCosts, DraftPause
from dsgraph.runtime.spec_schedule import VerifyScheduler
from dsgraph.runtime.structured.state import StructuredState

__all__ = ["SeqInfo", "SpecDecoder", "Verified"]


@dataclass(frozen=True)
class Verified:
    samples: Samples  # per sample row: the emitted token (-1 past a sequence's emission), logprob, top
    num_emitted: np.ndarray  # [seqs] i32: tokens each sequence emits (0 without sample rows)
    accepted: np.ndarray  # [seqs] i32: drafts accepted (0 without drafts)


class SpecDecoder:
    """The engine's speculative half: the drafter, the draft log-prob pool, verification and statistics."""

    def __init__(
        self,
        session: Any,
        weights: Any,
        sampler: Sampler,
        scheduler: VerifyScheduler,
        *,
        nextn: int,
        deterministic: bool,
    ) -> None:
        self.drafter = DraftRunner(session, weights, stream=0 if deterministic else DRAFT_STREAM)
        self.sampler, self.scheduler, self.nextn = sampler, scheduler, nextn
        self.deterministic = deterministic
        self.vocab = vocab = session.model.cfg.text.vocab_size
        self.pool = torch.zeros(session.cache_sizes.num_slots, nextn, vocab, device=session.device)
        self.confidence: dict[int, np.ndarray] = {}  # rid -> confidences of the drafts it holds
        self.cost = DraftCosts(DraftCost())  # setup_spec replaces it with the profiled or given cost
        self.pause: DraftPause | None = None  # None: draft every step (draft_pause off, or no curve)
        self.draft_passes = 0
        self.structured: StructuredState | None = None  # the engine's grammars (constrained requests)
        # the draft pass expected after the next step, by draft depth (ms; empty when this step drafted
        # nothing): the confidence planner charges it to every plan that verifies drafts
        # (Scheduler.draft_depth_ms)
        self.next_draft_depth_ms: list[float] = []

    def verify(self, plan: StepPlan, logits: torch.Tensor, seqs: Sequence[SeqInfo | None]) -> Verified:
        """Decide every sample row of the plan; `seqs[s]` describes plan sequence s."""
        rows = np.asarray(plan.sample_rows, dtype=np.int64)
        start, length = np.asarray(plan.verify_start), np.asarray(plan.verify_len)
        row_seq = np.repeat(np.arange(len(length)), length)
        info = [seqs[s] or RELEASED for s in row_seq.tolist()]
        params, seeds = [i.params for i in info], [i.seed for i in info]
        positions = torch.from_numpy(np.asarray(plan.positions)[rows] + 1)
        tokens = np.asarray(plan.token_ids)
        is_draft = np.ones(len(rows), dtype=bool)
        is_draft[start[length > 0] + length[length > 0] - 1] = False  # bonus rows
        drafts = np.where(is_draft, tokens[np.minimum(rows + 1, len(tokens) - 1)], 0).astype(np.int32)
        allowed = self._allowed(seqs, start, length, drafts)
        s = self.sampler.sample(logits, params, seeds, positions, allowed=allowed)
        if self.deterministic or not (length > 1).any():
            match = (drafts == s.tokens.numpy()) & is_draft
            emitted, logprobs = s.tokens.numpy().copy(), s.logprobs.clone()
            accepted = np.array([_leading(match[a : a + n]) for a, n in zip(start, length, strict=True)])
        else:
            num, emitted_t, logprobs = self._exact(
                plan, logits, drafts, params, seeds, positions, row_seq, allowed
            )
            emitted, accepted = emitted_t.numpy().copy(), np.maximum(num.numpy(), 0)
        accepted = np.where(length > 0, accepted, 0)
        num_emitted = np.where(length > 0, accepted + 1, 0).astype(np.int32)
        self._force(logits, seqs, start, num_emitted, accepted, emitted, logprobs)
        mask = np.arange(len(rows)) - start[row_seq] >= num_emitted[row_seq]
        emitted[mask] = -1
        samples = Samples(torch.from_numpy(emitted), logprobs, s.top_logprobs, s.top_ids)
        return Verified(samples, num_emitted, accepted.astype(np.int32))

    def invalid_rows(self, plan: StepPlan, logits: torch.Tensor, v: Verified) -> dict[int, str]:
        """Sample row -> cause, for rows whose logits hold NaN/+inf or whose emitted id lies outside the
        vocabulary (runtime/row_checks.py; rows past a sequence's emission carry no token)."""
        start, length = np.asarray(plan.verify_start), np.asarray(plan.verify_len)
        row_seq = np.repeat(np.arange(len(length)), length)
        emitted = np.arange(len(row_seq)) - start[row_seq] < v.num_emitted[row_seq]
        return row_causes(logits, v.samples.tokens, self.vocab, emitted)

    def _exact(
        self,
        plan: StepPlan,
        logits: torch.Tensor,
        drafts: np.ndarray,
        params: list[SamplingParams],
        seeds: list[int],
        positions: torch.Tensor,
        row_seq: np.ndarray,
        allowed: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`spec_verify` with each draft row's draft distribution from the pool."""
        start = np.asarray(plan.verify_start)
        slots = np.asarray(plan.seq_slot)[row_seq]
        index = np.arange(len(row_seq)) - start[row_seq]
        draft_lp = self.pool[torch.from_numpy(slots), torch.from_numpy(np.minimum(index, self.nextn - 1))]
        return self.sampler.verify(
            logits,
            torch.from_numpy(drafts),
            draft_lp,
            params,
            seeds,
            positions,
            torch.from_numpy(start.astype(np.int32)),
            torch.from_numpy(np.array(plan.verify_len, dtype=np.int32)),
            allowed,
        )

    def _allowed(
        self, seqs: Sequence[SeqInfo | None], start: np.ndarray, length: np.ndarray, drafts: np.ndarray
    ) -> torch.Tensor | None:
        """The grammar masks of every row (each draft position after the drafts before it), or None."""
        if self.structured is None or not self.structured.grammars:
            return None
        rids = [-1 if info is None else info.rid for info in seqs]
        return self.structured.verify_mask(rids, start.tolist(), length.tolist(), drafts.tolist())

    @staticmethod
    def _force(
        logits: torch.Tensor,
        seqs: Sequence[SeqInfo | None],
        start: np.ndarray,
        num_emitted: np.ndarray,
        accepted: np.ndarray,
        emitted: np.ndarray,
        logprobs: torch.Tensor,
    ) -> None:
        """Teacher forcing: a sequence with a golden token left emits it alone (no draft accepted)."""
        rows, ids = [], []
        for k, info in enumerate(seqs):
            if info is None or info.forced is None or num_emitted[k] == 0:
                continue
            num_emitted[k], accepted[k] = 1, 0
            rows.append(int(start[k]))
            ids.append(info.forced)
        force_rows(logits, rows, ids, torch.from_numpy(emitted), logprobs)

    def draft(self, plan: StepPlan, v: Verified, seqs: Sequence[SeqInfo | None]) -> tuple[np.ndarray, ...]:
        """Drafts for every sequence that emitted tokens and goes on: (tokens [seqs, nextn] i32, lengths
        [seqs] i32, confidences [seqs, nextn] f64), the commit's draft arrays."""
        n = plan.num_seqs
        tokens, lengths = np.zeros((n, self.nextn), np.int32), np.zeros(n, np.int32)
        conf = np.zeros((n, self.nextn), np.float64)
        emitted = v.samples.tokens.numpy()
        start, rows = np.asarray(plan.verify_start), np.asarray(plan.sample_rows)
        todo: list[tuple[int, DraftRequest]] = []
        drafted: list[tuple[int, SeqInfo]] = []
        for k, info in enumerate(seqs):
            m = int(v.num_emitted[k])
            if info is None or m == 0 or not info.continues(emitted[start[k] : start[k] + m].tolist()):
                continue
            last = int(start[k]) + m - 1
            t, p, top_k, min_p = info.params.op_row()
            anchor = DraftRequest(
                int(emitted[last]),
                int(plan.positions[rows[last]]) + 1,
                int(plan.seq_slot[k]),
                int(plan.seq_window_start[k]),
                t,
                p,
                top_k,
                min_p,
                info.seed,
            )
            todo.append((k, anchor))
            drafted.append((k, info))
        greedy = self.drafter.greedy_variant([r for _, r in todo])  # the variant the pass will run
        if todo and self.pause is not None and not self.pause.decide(len(todo), greedy):
            todo, drafted = [], []  # paused: the requests go on as plain decode rows
        # a probe's drafts measure the acceptance: the planner verifies them as paid for
        probe = self.pause is not None and self.pause.last_probe
        pricing = self.cost.pricing(greedy)
        self.next_draft_depth_ms = pricing.by_depth(len(todo)) if todo and not probe else []
        if todo:
            start_time = time.perf_counter()
            # its tokens come to the host: synchronised
            out = self.drafter.run([r for _, r in todo], greedy=greedy)
            if not self.drafter.last_captured:  # a pass that captured its bucket: its time is not a cost
                self.cost.measuring(greedy).observe(len(todo), (time.perf_counter() - start_time) * 1e3)
            self.draft_passes += 1
            width = min(self.nextn, out.tokens.shape[1])
            if out.logprobs is not None:  # None: greedy requests only, whose p_d verification never reads
                slots = torch.tensor([req.slot for _, req in todo], dtype=torch.long, device=self.pool.device)
                self.pool[slots, :width] = out.logprobs[:, :width]  # one copy for the whole batch
            for i, (k, _) in enumerate(todo):
                tokens[k, :width], lengths[k] = out.tokens[i, :width].numpy(), width
                conf[k, :width] = out.confidence[i, :width].double().clamp(0, 1).numpy()
                # a draft id outside the vocabulary (a broken drafter) would be an input of the next step
                d = tokens[k, : lengths[k]]
                lengths[k] = _leading((d >= 0) & (d < self.vocab))
                self._trim(
                    drafted[i][1].rid, emitted[start[k] : start[k] + v.num_emitted[k]], tokens[k], lengths, k
                )
            if self.pause is not None:
                picked = [k for k, _ in todo]
                self.pause.seed_confidences(conf[picked], lengths[picked])
        self.confidence = {info.rid: conf[k, : lengths[k]].copy() for k, info in drafted}
        return tokens, lengths, conf

    def _trim(self, rid: int, emitted: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, k: int) -> None:
        """A constrained request verifies only the drafts its grammar allows (the others would be
        rejected): the next step's rows are not spent on them."""
        if self.structured is not None and rid in self.structured.grammars:
            n = int(lengths[k])
            lengths[k] = self.structured.valid_drafts(rid, emitted.tolist(), tokens[:n].tolist())

    def record(self, plan: StepPlan, v: Verified, held: dict[int, np.ndarray]) -> list[tuple[int, int, int]]:
        """Statistics of the plan's decode sequences; returns (rid, verified, accepted) per sequence.
        `held`: the confidences each request's drafts had when the plan was made."""
        out: list[tuple[int, int, int]] = []
        verified, accepted, conf = [], [], []
        for k in range(plan.num_decode):
            rid, n = int(plan.seq_rids[k]), int(plan.verify_len[k]) - 1
            if n < 0:
                continue
            c = held.get(rid, np.zeros(0))[:n]
            verified.append(n)
            accepted.append(min(int(v.accepted[k]), n))
            conf.append(np.pad(c, (0, n - len(c))))
            out.append((rid, n, accepted[-1]))
        if verified:
            self.scheduler.record(verified, accepted, conf)
            if self.pause is not None:
                self.pause.observe(verified, accepted)
        return out

    def snapshot(self) -> dict[str, object]:
        """The scheduler's statistics plus draft passes and pausing (`runtime/spec_pause.py`)."""
        out = {**self.scheduler.snapshot(), "draft_passes": self.draft_passes, "paused_steps": 0}
        return out | ({} if self.pause is None else self.pause.snapshot())


def _leading(match: np.ndarray) -> int:
    """Leading True entries (the accepted drafts of one sequence's rows)."""
    misses = np.flatnonzero(~match)
    return int(misses[0]) if len(misses) else len(match)
