"""The engine loop: C++ scheduler -> ModelRunner (model step, sampling or DSpark verification and
drafting; runtime/model_runner.py) -> scheduler update, one step per `step()` call. The engine keeps the
requests: per-request sampling params, detokenization, stop strings, logprobs and events. With overlap
on, the next step is launched before this one's tokens reach the host (zero-overhead scheduling,
runtime/engine_overlap.py), or with drafting on before this one's commit work (runtime/spec_overlap.py).

A step in phases, the engine's surface for the loops that drive the runner themselves (the overlap
loops; `run_plain` is the whole of a plain step):
- `take_plan` (the plan made by the last commit, else a fresh one) and `hold_plan` (put one back for
  the next call);
- `begin_step(plan)` before the plan goes to the runner (`ModelRunner.submit` / `launch_sampled`);
- a commit, one native call that also plans the next step: `commit_step(out)` with a `StepOutput` of
  `ModelRunner.wait`, or, overlapped, `commit_ahead` (the step in flight gets its tokens, the one just
  launched is committed ahead of them) and `resolve_ahead` (the step in flight gets its tokens alone);
  a commit fails the requests of invalid rows and returns a `Committed`;
- `finish_step(committed)`: its TokenEvents (detokenization, stop strings, logprobs);
- on failure: `fail_step(plan, exc)` (a step failed before sampling: its requests fail, the plan is
  committed without running), `fail_requests(plan, exc)` (its requests alone), `skip_step(plan)` (every
  request of the plan ended: commit it without running).
`has_unfinished` holds from `take_plan` to the commit of the plan taken (and, overlapped, until the step
committed ahead is resolved): the caches of a request aborted in a plan already made stay held until
then, and an engine that reports nothing unfinished holds none (the server's idle is read so)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsgraph.models.interface import default_geometry, numerics_for
from dsgraph.models.registry import family_for
from dsgraph.platform.registry import resolve_device
from dsgraph.runtime.bundle.session_load import open_for_engine
from dsgraph.runtime.checkpoint_load import cache_sizes, checked_max_len, load_weights
from dsgraph.runtime.derived_configs import scheduler_config
from dsgraph.runtime.detokenizer import IncrementalDetokenizer
from dsgraph.runtime.engine_config import EngineConfig
from dsgraph.runtime.engine_overlap import OverlapLoop, SpecOverlap, resolve_overlap
from dsgraph.runtime.engine_records import (
    Committed,
    Live,
    TokenEvent,
    count_cached,
    emitted_rows,
    new_text,
)
from dsgraph.runtime.input_fix import InputFix
from dsgraph.runtime.kvstore.pd_engines import admit_handoff, export_handoff, pd_state
from dsgraph.runtime.kvstore.prefix_import import store_import_for
from dsgraph.runtime.model_runner import ModelRunner, StepOutput
from dsgraph.runtime.prefill_truncation import PrefillTruncation
from dsgraph.runtime.row_checks import marked_causes
from dsgraph.runtime.sampler import Sampler, Samples
from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.scheduler import Scheduler, StepEvent, StepPlan
from dsgraph.runtime.seq_info import SeqInfo
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.runtime.spec_engine import SpecDecoder
from dsgraph.runtime.spec_setup import SpecSetup, setup_spec
from dsgraph.runtime.structured.state import StructuredState


class Engine:
    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig = EngineConfig(),
        *,
        rank: Any = None,
        store: Any = None,
    ) -> None:
        """`rank`: a `runtime.distributed.rank.RankSetup` makes this one rank of an expert-parallel group.
        `store`: the kvstore TieredStore a PROMPT engine writes prompt pages through to and a COMPLETION
        engine reads handed-off pages from (None: pages travel inline in the handoff)."""
        root = Path(model_dir)
        self.model_dir = root
        resolve_device(config.platform)  # an absent device fails here, before any weight is read
        bundle = open_for_engine(config, root, rank.config.ep if rank else 1) if config.bundle else None
        config = config if bundle is None else bundle.with_tables(config)
        family = family_for(root)
        cfg = family.load_config(root)
        self.config, self.cfg = config, cfg
        self.tokenizer = family.load_tokenizer(root, cfg)
        num = numerics_for(config.numerics)
        max_len = checked_max_len(config.max_model_len, cfg.text.max_position_embeddings)
        weights = load_weights(family, root, cfg, config, num, self.tokenizer)
        if rank is not None:
            weights = rank.local_weights(weights)
        drafting = (
            config.speculative if config.engine_type == "normal" else replace(config.speculative, mode="off")
        )
        spec = SpecSetup.resolve(drafting, cfg, weights, platform=config.platform)
        if bundle is not None:
            bundle.check_drafting(spec.enabled)
        geo = default_geometry(cfg.text, max_len, config.cache.page_size)
        # the model first: a family without truncation refuses it there, naming the option
        self.model = family.build(cfg, self.tokenizer, num, geo, spec.enabled, config.truncation.mode)
        self.truncation = PrefillTruncation.for_engine(cfg.text, config.truncation, spec.nextn or None)
        if rank is not None:
            self.model = dataclasses.replace(self.model, expert_parallel=True)
        sizes = self._cache_sizes()
        platform = rank.platform(config.platform) if rank is not None else config.platform
        self.session = Session(self.model, weights, sizes, platform=platform, cuda=config.cuda, bundle=bundle)
        self.sampler = Sampler(cfg.text.vocab_size, graphs=bundle.sampler_graphs() if bundle else None)
        self.spec: SpecDecoder | None = None
        curve = None
        if spec.enabled:
            self.spec, curve = setup_spec(spec, self, weights)
        self.structured = StructuredState(self.tokenizer, cfg.text.vocab_size, [cfg.eos_token_id])
        if self.spec is not None:
            self.spec.structured = self.structured
        self.live: dict[int, Live] = {}
        self.runner = ModelRunner(
            self.session,
            self.sampler,
            requests=self.live,
            seq_info=self._seq_info,
            eos_id=cfg.eos_token_id,
            truncation=self.truncation,
            structured=self.structured,
            spec=self.spec,
        )
        self.scheduler = self._scheduler(sizes, spec, curve)
        # a COMPLETION engine runs without overlap: its loop of admitted handoffs has no overlapped form
        overlap = config.engine_type != "completion" and resolve_overlap(config, spec.enabled)
        self.overlap = (SpecOverlap(self) if spec.enabled else OverlapLoop(self)) if overlap else None
        self._plan = None  # the plan of the next step, made by the last `advance`
        # the plan `take_plan` handed out, until a commit: it holds its requests' caches (aborted ones too)
        self._taken: StepPlan | None = None
        self._prefilling: set[int] = set()  # requests whose prompt-cache hit is still being counted
        self.pd = None if config.engine_type == "normal" else pd_state(self, store)
        self.store_import = store_import_for(self, store)  # store hits skip prefill (kvstore/prefix_import)
        if rank is not None:
            rank.bind(self)

    def _cache_sizes(self) -> CacheSizes:
        return cache_sizes(self.model, self.config)

    def _scheduler(self, sizes: CacheSizes, spec: SpecSetup, curve: Any) -> Scheduler:
        """The C++ scheduler over the session's pages and slots, with the engine's limits."""
        return Scheduler(scheduler_config(self.config, self.model, sizes, spec.scheduler_fields()), curve)

    def add_request(
        self,
        rid: int,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int | None = None,
        max_chunk: int = 0,
    ) -> None:
        """Queue a request; bad prompt or params raise RequestError naming the field and queue nothing.
        `max_chunk` > 0: no step prefills more than that many of its prompt tokens (a router's chunk
        size, sized to a step time budget)."""
        params.validate(self.cfg.text.vocab_size)
        if max_chunk < 0:
            raise RequestError("max_chunk", max_chunk, "0 (no limit) or a positive number of tokens")
        if not prompt_ids:
            raise RequestError("prompt", list(prompt_ids), "a non-empty list of token ids")
        vocab = self.cfg.text.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= int(t) < vocab), None)
        if bad is not None:
            raise RequestError("prompt", bad, f"a token id in [0, {vocab})")
        if len(prompt_ids) >= self.model.geo.max_model_len:
            raise RequestError(
                "prompt",
                f"{len(prompt_ids)} tokens",
                f"shorter than max_model_len {self.model.geo.max_model_len}",
            )
        live = Live(
            params,
            params.completion_seeds()[0] if seed is None else seed,
            [int(t) for t in prompt_ids],
            IncrementalDetokenizer(
                self.tokenizer, list(prompt_ids), skip_special_tokens=params.skip_special_tokens
            ),
            max_chunk=max_chunk,
        )
        if params.structured_outputs is None:
            self._admit(rid, live)
        else:  # queued once its grammar is compiled (at once when it is cached)
            self.structured.add(rid, params.structured_outputs, lambda: self._admit(rid, live))
            self.live.setdefault(rid, live)

    def _admit(self, rid: int, live: Live) -> None:
        imp = self.store_import
        if imp is not None and live.params.prompt_logprobs is None:
            if imp.start(rid, live.prompt, lambda: self._queue(rid, live)):
                self.live[rid] = live
                return  # queued once its store blocks are read (prefix_import.StoreImport.poll)
        self._queue(rid, live)

    def _queue(self, rid: int, live: Live) -> None:
        p = live.params
        eos = -1 if p.ignore_eos else self.cfg.eos_token_id
        self.scheduler.add_request(
            rid,
            live.prompt,
            max_tokens=p.max_tokens,
            eos_id=eos,
            ignore_eos=p.ignore_eos,
            stop_token_ids=p.stop_token_ids,
            # prompt logprobs need every position computed: a cached prefix would leave holes
            use_prefix_cache=p.prompt_logprobs is None,
            max_chunk=live.max_chunk,
        )
        self.live[rid] = live
        self._prefilling.add(rid)

    def add_prefilled(
        self, rid: int, handoff: Any, pages: dict[int, list[bytes]], params: SamplingParams
    ) -> None:
        """COMPLETION engine: admit a PROMPT engine's prefilled request (a kvstore Handoff and its pages,
        `pd_engines.fetch_pages`); it decodes from the next step. Raises and holds nothing on failure."""
        admit_handoff(self, rid, handoff, pages, params)

    def abort(self, rid: int) -> None:
        if rid in self.live and self.live[rid].finish is None:
            if self.store_import is not None:
                self.store_import.cancel(rid)
            self.scheduler.abort(rid)
            self.structured.release(rid)
            self.live[rid].finish = "abort"

    def release(self, rid: int) -> None:
        """Forget a finished request's record once its outputs were read (servers call this per request)."""
        live = self.live.get(rid)
        if live is not None and live.finish is None:
            raise ValueError(f"release: request {rid} has not finished")
        self.live.pop(rid, None)
        self._prefilling.discard(rid)
        self.structured.release(rid)

    def spec_stats(self) -> dict[str, object] | None:
        """Speculative decoding statistics since the start (per-position acceptance, mean accepted length,
        confidence calibration; `runtime/csrc/spec_stats.h`), draft passes and paused steps
        (`runtime/spec_pause.py`), or None with drafting off."""
        return None if self.spec is None else self.spec.snapshot()

    def prefix_cache_stats(self) -> tuple[int, int]:
        """(prompt tokens looked up, prompt tokens served from the prefix cache) since the start."""
        n = self.scheduler.native
        return n.prefix_lookup_tokens, n.prefix_hit_tokens

    @property
    def has_unfinished(self) -> bool:
        # a request aborted while in the planned step holds its caches until that step is committed,
        # also while the step runs (taken) and, overlapped, until the step committed ahead of its tokens
        # is resolved: a loop or a thread that reads False mid-step must find every cache freed
        return (
            self.scheduler.has_unfinished
            or (self._plan is not None and self._plan.bucket > 0)
            or (self._taken is not None and self._taken.bucket > 0)
            or self.scheduler.has_unresolved
            or (self.overlap is not None and self.overlap.busy)
            or bool(self.structured.pending)
            or bool(self.store_import and self.store_import.pending)
        )

    def step(self) -> list[TokenEvent]:
        """One model step; returns the tokens it produced (one event per sampled request).

        The plan of a step is made by the previous step's single native call (`advance`: commit that
        step, plan this one), so a request added in between joins one step later. With overlap on, the
        tokens returned are those of the step launched by the previous call (engine_overlap.py).
        """
        refused = self._poll_grammars()
        if self.store_import is not None:
            idle = not self.scheduler.has_unfinished and (self._plan is None or self._plan.bucket == 0)
            for rid, error in self.store_import.poll(idle):
                live = self.live[rid]
                live.finish, live.error = "abort", error
                refused.append(TokenEvent(rid, -1, "", 0.0, [], True, "error", 0, error))
        if self.overlap is not None:
            return refused + self.overlap.step()
        return refused + self.run_plain(self.take_plan())

    def _poll_grammars(self) -> list[TokenEvent]:
        """Admit the requests whose grammar compiled; end those whose compile failed or timed out."""
        idle = not self.scheduler.has_unfinished and (self._plan is None or self._plan.bucket == 0)
        out = []
        for rid, error in self.structured.poll(idle):
            live = self.live[rid]
            live.finish, live.error = "abort", error
            out.append(TokenEvent(rid, -1, "", 0.0, [], True, "error", 0, error))
        return out

    def take_plan(self) -> StepPlan:
        """The plan of the next step: the one the last commit made (or `hold_plan` kept), else a fresh
        one; the engine holds none to hand out afterwards, and counts it unfinished until a commit."""
        plan = self._plan if self._plan is not None else self.scheduler.schedule()
        self._taken = plan  # before `_plan` is cleared: a thread reading has_unfinished sees one of them
        self._plan = None
        return plan

    def hold_plan(self, plan: StepPlan) -> None:
        """Keep `plan` (taken and not run) for the next `take_plan`."""
        self._plan, self._taken = plan, None

    def run_plain(self, plan: StepPlan, fix: InputFix | None = None) -> list[TokenEvent]:
        """Run, sample and commit `plan` (then plan the next step) in one go. `fix`: rows whose token is
        a sample of the step before, taken from its device tensor (a step after an overlapped one)."""
        if plan.bucket == 0:
            events = self._planned(self.scheduler.advance([]))
            return [self._abort_event(e) for e in events if e.reason == "abort"]
        if not self.scheduler.has_unfinished:  # every request of the plan was aborted: free their caches
            self.skip_step(plan)  # their callers know already (as for aborts in a plan that runs)
            return []
        self.begin_step(plan)
        try:
            out = self.runner.wait(self.runner.submit(plan, fix))
        except Exception as exc:  # the step's requests fail; the engine and everyone else go on
            return self.fail_step(plan, exc)
        return self.finish_step(self.commit_step(out))

    def begin_step(self, plan: StepPlan) -> None:
        """`plan` goes to the runner now: count its prefix-cache hits (`engine_records.count_cached`)."""
        count_cached(plan, self.live, self._prefilling)

    def commit_step(self, out: StepOutput) -> Committed:
        """Commit a step's output and plan the next step (one native call): its prompt logprobs and
        draft statistics are recorded, the requests of its invalid rows fail first, alone, and the next
        plan is given its draft-pass cost."""
        for rid, pos, entry in out.prompt:
            self.live[rid].prompt_logprobs[pos] = entry
        for rid, verified, accepted in out.verified:
            if rid in self.live:
                self.live[rid].num_draft_tokens += verified
                self.live[rid].num_accepted_tokens += accepted
        if self.spec is not None:  # the next plan weighs its draft pass
            self.scheduler.native.draft_depth_ms = self.runner.draft_depth_ms
        failed = self._fail_rows(out.plan.sample_rids, out.bad_rows, out.samples.tokens)
        tokens = out.samples.tokens.numpy()
        events = self._planned(self.scheduler.advance(tokens, out.num_emitted, out.drafts))
        return Committed(out.plan, out.samples, events, out.num_emitted, failed)

    def commit_ahead(self, flight: StepPlan | None, host: Samples | None) -> Committed:
        """Overlapped commit, one native call (`Scheduler.advance_ahead`): the step in flight (`flight`;
        `host`: its samples on the host, None when it did not run) gets its tokens, the requests of its
        rows marked invalid on the device failing first; the step launched since is committed ahead of
        its tokens and the next one planned."""
        tokens = _flight_tokens(flight, host)
        failed = self._fail_marked(flight, host, tokens)
        events = self._planned(self.scheduler.advance_ahead(tokens))
        return Committed(flight, host, events, None, failed)

    def resolve_ahead(self, flight: StepPlan, host: Samples | None) -> Committed:
        """The step in flight gets its tokens and nothing is planned (`Scheduler.resolve`): before a
        step that runs without overlap. Its marked invalid rows fail first, as in `commit_ahead`."""
        tokens = _flight_tokens(flight, host)
        failed = self._fail_marked(flight, host, tokens)
        return Committed(flight, host, self.scheduler.resolve(tokens), None, failed)

    def _fail_marked(
        self, flight: StepPlan | None, host: Samples | None, tokens: np.ndarray
    ) -> list[TokenEvent]:
        """Fail the requests of an overlapped step's rows marked invalid on the device."""
        if flight is None or host is None:
            return []
        causes = marked_causes(host, self.cfg.text.vocab_size)
        return self._fail_rows(flight.sample_rids, causes, torch.from_numpy(tokens))

    def finish_step(self, c: Committed) -> list[TokenEvent]:
        """The TokenEvents of a committed step: the requests its commit failed, then one event per
        emitted token (none for a step that did not run)."""
        if c.samples is None or c.plan is None:
            return c.failed  # aborts only: their callers know
        rows = emitted_rows(c.plan, c.num_emitted)
        out = list(c.failed)
        for e in c.events:
            if e.token < 0 or e.rid not in self.live or self.live[e.rid].finish is not None:
                continue  # aborts (already known to their callers), released or stopped requests
            try:
                out.append(self.emit_token(rows[e.rid].pop(0), e.rid, c.samples, e))
            except Exception as exc:  # one request's post-processing failed: only it ends
                out.append(self._fail(e.rid, exc))
        return out

    def fail_step(self, plan: StepPlan, exc: Exception) -> list[TokenEvent]:
        """The step failed before sampling: fail every request in it, then commit the plan with
        placeholder tokens, which the scheduler drops for aborted requests."""
        failed = self.fail_requests(plan, exc)
        self.skip_step(plan)
        return failed

    def fail_requests(self, plan: StepPlan, exc: Exception) -> list[TokenEvent]:
        """Fail every live request of `plan` with `exc` (their caches are freed by the scheduler)."""
        rids = dict.fromkeys(int(r) for r in plan.seq_rids[: plan.num_seqs])
        return [self._fail(r, exc) for r in rids if r in self.live and self.live[r].finish is None]

    def skip_step(self, plan: StepPlan) -> None:
        """Commit a plan without running it; only valid when all its requests were aborted (the
        scheduler drops their placeholder tokens and frees their caches)."""
        self._planned(self.scheduler.advance(np.zeros(len(plan.sample_rows), dtype=np.int32)))

    def _planned(self, committed: tuple[list[StepEvent], StepPlan]) -> list[StepEvent]:
        """Keep the next plan of a commit (`Scheduler.advance` / `advance_ahead`: (events, plan)); the
        plan taken before is the scheduler's again (committed, or in flight for an overlap loop, which
        counts it busy). Returns the events."""
        events, self._plan = committed  # the next plan is kept before the taken one is let go (as above)
        self._taken = None
        return events

    def _fail_rows(self, rids, causes: dict[int, str], tokens: torch.Tensor) -> list[TokenEvent]:  # type: ignore[no-untyped-def]
        """Fail alone each request with an invalid sample row (runtime/row_checks.py, `rids`: the
        request of each row); the row gets a placeholder token, which the scheduler drops for an aborted
        request."""
        out = []
        for i, cause in causes.items():
            rid = int(rids[i])
            if rid in self.live and self.live[rid].finish is None:
                out.append(self._fail(rid, FloatingPointError(cause)))
            tokens[i] = 0
        return out

    def _seq_info(self, rid: int) -> SeqInfo | None:
        live = self.live.get(rid)
        if live is None or live.finish is not None:
            return None
        golden = live.params.golden_token_ids
        forced = golden[len(live.tokens)] if len(live.tokens) < len(golden) else None
        return SeqInfo(rid, live.params, live.seed, forced, lambda new: self._continues(live, new))

    def _continues(self, live: Live, new: list[int]) -> bool:
        """Whether a request goes on after emitting `new` (the scheduler decides; this only spares the
        drafter the requests that surely stop)."""
        p = live.params
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else {self.cfg.eos_token_id})
        total = len(live.prompt) + len(live.tokens) + len(new)
        return (
            not stops & set(new)
            and len(live.tokens) + len(new) < p.max_tokens
            and total < self.model.geo.max_model_len
        )

    def _fail(self, rid: int, exc: Exception) -> TokenEvent:
        """End one request with an internal error (its caches are freed by the scheduler's abort)."""
        live = self.live[rid]
        self.scheduler.abort(rid)
        live.finish, live.error = "abort", f"internal error: {type(exc).__name__}: {exc}"
        self._prefilling.discard(rid)
        return TokenEvent(rid, -1, "", 0.0, [], True, "error", live.num_cached_tokens or 0, live.error)

    def _abort_event(self, e) -> TokenEvent:  # type: ignore[no-untyped-def]
        return TokenEvent(e.rid, -1, "", 0.0, [], True, "abort")

    def emit_token(self, i: int, rid: int, s: Samples, event: Any) -> TokenEvent:
        """Commit request `rid`'s token of sample row `i` (`event`: its scheduler event) to the
        request: detokenization, stop strings, logprobs, a PROMPT engine's handoff; its TokenEvent. An
        exception here fails this request alone (`finish_step`; the server's fault hook wraps it)."""
        live, token = self.live[rid], int(s.tokens[i])
        self._prefilling.discard(rid)  # a sampled row ends the prefill: the hit count is final
        self.structured.accept(rid, token)
        k = live.params.num_top_logprobs
        top = list(zip(s.top_ids[i, :k].tolist(), s.top_logprobs[i, :k].tolist(), strict=True))
        live.tokens.append(token)
        if len(live.tokens) == 1 and self.store_import is not None and self.pd is None:
            self.store_import.write_through(live.prompt)  # a PROMPT engine's export writes its own
        live.logprobs.append(float(s.logprobs[i]))
        live.top.append(top)
        finished, reason = bool(event and event.finished), event.reason if event else None
        prefilled = reason == "prefilled"  # the text goes on on the completion engine: nothing is flushed
        text = self.push_text(rid, live, token, finished and not prefilled)
        handoff = None
        if live.finish == "stop" and (prefilled or not finished):  # a stop string (caches freed)
            finished, reason = True, "stop"
        elif prefilled:
            live.finish = reason
            handoff = export_handoff(self, rid)
        elif finished:
            live.finish = reason
            if reason == "stop" and token in live.params.stop_token_ids:
                live.stop_reason = token
        cached = live.num_cached_tokens or 0
        prompt_lp = None
        if live.params.prompt_logprobs is not None and len(live.tokens) == 1:
            prompt_lp = tuple(live.prompt_logprobs.get(p) for p in range(len(live.prompt)))
        lp = float(s.logprobs[i])
        return TokenEvent(
            rid, token, text, lp, top, finished, reason, cached, prompt_logprobs=prompt_lp, handoff=handoff
        )

    def push_text(self, rid: int, live: Live, token: int, finished: bool) -> str:
        """`token`'s new text for request `rid` (`engine_records.new_text`); a stop string ends the
        request and frees its caches now. A COMPLETION engine replays a handoff's tokens through it."""
        text, stopped = new_text(live, token, finished)
        if stopped:
            self.scheduler.abort(rid)
        return text


def _flight_tokens(flight: StepPlan | None, host: Samples | None) -> np.ndarray:
    """The sampled tokens of an overlapped step in flight, one per sample row (placeholders for a step
    that did not run; none without a step in flight)."""
    if host is not None:
        return host.tokens.numpy()
    return np.zeros(0 if flight is None else len(flight.sample_rows), dtype=np.int32)
