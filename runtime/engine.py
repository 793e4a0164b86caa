"""The engine loop: C++ scheduler -> ModelRunner (model step, sampling or DSpark verification and
drafting; runtime/model_runner.py) -> scheduler update, one step per `step()` call. The engine keeps the
requests: per-request sampling params, detokenization, stop strings, logprobs and events. With overlap
on, the next step is launched before this one's tokens reach the host (zero-overhead scheduling,
runtime/engine_overlap.py), or with drafting on before this one's commit work (runtime/spec_overlap.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
from dsgraph.runtime.detokenizer import IncrementalDetokenizer, find_stop, stop_prefix_len
from dsgraph.runtime.engine_config import EngineConfig
from dsgraph.runtime.engine_overlap import OverlapLoop, SpecOverlap, resolve_overlap
from dsgraph.runtime.input_fix import InputFix
from dsgraph.runtime.kvstore.pd_engines import admit_handoff, export_handoff, pd_state
from dsgraph.runtime.kvstore.prefix_import import store_import_for
from dsgraph.runtime.model_runner import ModelRunner, StepOutput
from dsgraph.runtime.prefill_truncation import PrefillTruncation
from dsgraph.runtime.prompt_logprobs import PromptEntry
from dsgraph.runtime.sampler import Sampler, Samples
from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.scheduler import Scheduler, StepPlan
from dsgraph.runtime.seq_info import SeqInfo
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.runtime.spec_engine import SpecDecoder
from dsgraph.runtime.spec_setup import SpecSetup, setup_spec
from dsgraph.runtime.structured.state import StructuredState


@dataclass
class _Live:
    params: SamplingParams
    seed: int
    prompt: list[int]
    detok: IncrementalDetokenizer
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str | None = None
    prompt_logprobs: dict[int, PromptEntry] = field(default_factory=dict)  # prompt position -> entry
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    checked: int = 0  # text length already searched for stop strings
    emitted: int = 0  # text length already returned
    # Prompt tokens served from the prefix cache: counted from the plans while the prompt is prefilled
    # (first chunk's start + rows marked is_replay, which together reach the hit's end); None until the
    # request's first chunk is planned.
    num_cached_tokens: int | None = None
    error: str | None = None  # why the engine failed this request (finish is then "abort")
    num_draft_tokens: int = 0  # drafts verified for this request
    num_accepted_tokens: int = 0  # of those, accepted
    max_chunk: int = 0  # most prompt tokens one step prefills (0: the step budget alone)

    @property
    def text(self) -> str:
        return self.detok.text[: self.emitted]


@dataclass(frozen=True)
class TokenEvent:
    rid: int
    token: int
    text: str  # new text since the previous event of this request
    logprob: float
    top: list[tuple[int, float]]
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort", or "error" (see `error`)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (final from the first token)
    error: str | None = None  # set with finish_reason "error": the request failed inside the engine
    # with the first token of a request asking for prompt logprobs: one entry per prompt position (None
    # for the first)
    prompt_logprobs: tuple[PromptEntry | None, ...] | None = None
    # finish_reason "prefilled" (a PROMPT engine's request after its first token): the request's caches
    # and sampled token for a COMPLETION engine (a kvstore.pd_engines.Exported)
    handoff: Any = None


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
        self.live: dict[int, _Live] = {}
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
        live = _Live(
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

    def _admit(self, rid: int, live: _Live) -> None:
        imp = self.store_import
        if imp is not None and live.params.prompt_logprobs is None:
            if imp.start(rid, live.prompt, lambda: self._queue(rid, live)):
                self.live[rid] = live
                return  # queued once its store blocks are read (prefix_import.StoreImport.poll)
        self._queue(rid, live)

    def _queue(self, rid: int, live: _Live) -> None:
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
        # a request aborted while in the planned step holds its caches until that step is committed
        return (
            self.scheduler.has_unfinished
            or (self._plan is not None and self._plan.bucket > 0)
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
        plan = self._plan if self._plan is not None else self.scheduler.schedule()
        self._plan = None
        return refused + self._plain_step(plan)

    def _poll_grammars(self) -> list[TokenEvent]:
        """Admit the requests whose grammar compiled; end those whose compile failed or timed out."""
        idle = not self.scheduler.has_unfinished and (self._plan is None or self._plan.bucket == 0)
        out = []
        for rid, error in self.structured.poll(idle):
            live = self.live[rid]
            live.finish, live.error = "abort", error
            out.append(TokenEvent(rid, -1, "", 0.0, [], True, "error", 0, error))
        return out

    def _plain_step(self, plan, fix: InputFix | None = None) -> list[TokenEvent]:  # type: ignore[no-untyped-def]
        """Run, sample and commit `plan` (then plan the next step) in one go."""
        if plan.bucket == 0:
            events, self._plan = self.scheduler.advance([])
            return [self._abort_event(e) for e in events if e.reason == "abort"]
        if not self.scheduler.has_unfinished:  # every request of the plan was aborted: free their caches
            self._skip(plan)  # their callers know already (as for aborts in a plan that runs)
            return []
        self._count_cached(plan)
        try:
            out = self.runner.wait(self.runner.submit(plan, fix))
        except Exception as exc:  # the step's requests fail; the engine and everyone else go on
            return self._fail_plan(plan, exc)
        failed = self._take(out)
        events, self._plan = self.scheduler.advance(out.samples.tokens.numpy(), out.num_emitted, out.drafts)
        return failed + self._token_events(plan, out.samples, events, out.num_emitted)

    def _take(self, out: StepOutput) -> list[TokenEvent]:
        """Record a step output's prompt logprobs and draft statistics, fail the requests of its invalid
        rows alone (their events are returned) and hand the next plan its draft-pass cost."""
        for rid, pos, entry in out.prompt:
            self.live[rid].prompt_logprobs[pos] = entry
        for rid, verified, accepted in out.verified:
            if rid in self.live:
                self.live[rid].num_draft_tokens += verified
                self.live[rid].num_accepted_tokens += accepted
        if self.spec is not None:  # the next plan weighs its draft pass
            self.scheduler.native.draft_depth_ms = self.runner.draft_depth_ms
        return self._fail_rows(out.plan.sample_rids, out.bad_rows, out.samples.tokens)

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

    def _token_events(self, plan, s: Samples, events, num_emitted=None) -> list[TokenEvent]:  # type: ignore[no-untyped-def]
        """The TokenEvents of a committed step's scheduler events (`s`: its samples on the host)."""
        rows = _emitted_rows(plan, num_emitted)
        out = []
        for e in events:
            if e.token < 0 or e.rid not in self.live or self.live[e.rid].finish is not None:
                continue  # aborts (already known to their callers), released or stopped requests
            try:
                out.append(self._commit(rows[e.rid].pop(0), e.rid, s, e))
            except Exception as exc:  # one request's post-processing failed: only it ends
                out.append(self._fail(e.rid, exc))
        return out

    def _seq_info(self, rid: int) -> SeqInfo | None:
        live = self.live.get(rid)
        if live is None or live.finish is not None:
            return None
        golden = live.params.golden_token_ids
        forced = golden[len(live.tokens)] if len(live.tokens) < len(golden) else None
        return SeqInfo(rid, live.params, live.seed, forced, lambda new: self._continues(live, new))

    def _continues(self, live: _Live, new: list[int]) -> bool:
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

    def _count_cached(self, plan) -> None:  # type: ignore[no-untyped-def]
        """Per-request prefix-cache hits, read off the plan: a hit of h tokens admits the request at
        start <= h (the replay start) and marks its rows below h is_replay, so h = the first chunk's
        start + its is_replay rows over all prefill chunks. Only requests still prefilling are looked at."""
        for rid in plan.preempted:  # readmitted later with a fresh lookup
            live = self.live.get(int(rid))
            if live is not None and int(rid) in self._prefilling:
                live.num_cached_tokens = None
        if not self._prefilling:
            return
        n = plan.num_tokens
        replay = np.bincount(
            np.asarray(plan.seq_ids[:n])[np.asarray(plan.is_replay[:n]) != 0], minlength=plan.num_seqs
        )
        starts = plan.seq_start
        for k, rid in enumerate(plan.seq_rids[: plan.num_seqs].tolist()):
            live = self.live.get(rid)
            if live is None or rid not in self._prefilling:
                continue
            if live.num_cached_tokens is None:
                live.num_cached_tokens = int(starts[k])
            live.num_cached_tokens += int(replay[k])

    def _fail(self, rid: int, exc: Exception) -> TokenEvent:
        """End one request with an internal error (its caches are freed by the scheduler's abort)."""
        live = self.live[rid]
        self.scheduler.abort(rid)
        live.finish, live.error = "abort", f"internal error: {type(exc).__name__}: {exc}"
        self._prefilling.discard(rid)
        return TokenEvent(rid, -1, "", 0.0, [], True, "error", live.num_cached_tokens or 0, live.error)

    def _fail_plan(self, plan, exc: Exception) -> list[TokenEvent]:  # type: ignore[no-untyped-def]
        """The step failed before sampling: fail every request in it, then commit the plan with
        placeholder tokens, which the scheduler drops for aborted requests."""
        failed = self._fail_requests(plan, exc)
        self._skip(plan)
        return failed

    def _fail_requests(self, plan, exc: Exception) -> list[TokenEvent]:  # type: ignore[no-untyped-def]
        rids = dict.fromkeys(int(r) for r in plan.seq_rids[: plan.num_seqs])
        return [self._fail(r, exc) for r in rids if r in self.live and self.live[r].finish is None]

    def _skip(self, plan) -> None:  # type: ignore[no-untyped-def]
        """Commit a plan without running it; only valid when all its requests were aborted (the
        scheduler drops their placeholder tokens and frees their caches)."""
        _, self._plan = self.scheduler.advance(np.zeros(len(plan.sample_rows), dtype=np.int32))

    def _abort_event(self, e) -> TokenEvent:  # type: ignore[no-untyped-def]
        return TokenEvent(e.rid, -1, "", 0.0, [], True, "abort")

    def _commit(self, i: int, rid: int, s, event) -> TokenEvent:  # type: ignore[no-untyped-def]
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
        text = self._new_text(rid, live, token, finished and not prefilled)
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

    def _new_text(self, rid: int, live: _Live, token: int, finished: bool) -> str:
        """Text to emit for this token: never half a character, never a (partial) stop string."""
        p = live.params
        # stop strings count from min_tokens on (vLLM's rule); the text before stays searchable
        stops = p.stop if len(live.tokens) >= p.min_tokens else ()
        live.detok.push(token)
        if finished:
            live.detok.flush()
        full = live.detok.text
        cut = find_stop(full, stops, start=live.checked) if stops else None
        live.checked = len(full)
        if cut is not None and not finished:
            self.scheduler.abort(rid)  # a stop string ends the request; its caches are freed now
            live.finish = "stop"
        if cut is not None:
            live.stop_reason = next(s for s in stops if full.startswith(s, cut))
            cut += len(live.stop_reason) if p.include_stop_str_in_output else 0
        end = cut if cut is not None else len(full) - (0 if finished else stop_prefix_len(full, stops))
        text = full[live.emitted : max(end, live.emitted)]
        live.emitted = max(end, live.emitted)
        return text


def _emitted_rows(plan: StepPlan, num_emitted: np.ndarray | None) -> dict[int, list[int]]:
    """Per request, the sample rows whose tokens it emits, in order (the first num_emitted rows of its
    sequence; one per sampling sequence without num_emitted)."""
    out: dict[int, list[int]] = {}
    for k, (a, n) in enumerate(zip(plan.verify_start.tolist(), plan.verify_len.tolist(), strict=True)):
        m = min(n, 1) if num_emitted is None else int(num_emitted[k])
        out.setdefault(int(plan.seq_rids[k]), []).extend(range(a, a + m))
    return out
