"""What the engine keeps per request (`Live`) and returns per token (`TokenEvent`), the record of a
committed step whose events are still to be made (`Committed`), and the pure helpers over them:
a token's new text (detokenization, stop strings), the rows a request emits, prefix-cache hits read
off a plan. The engine loop itself is runtime/engine.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsgraph.runtime.detokenizer import IncrementalDetokenizer, find_stop, stop_prefix_len
from dsgraph.runtime.prompt_logprobs import PromptEntry
from dsgraph.runtime.sampler import Samples
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.scheduler import StepPlan

__all__ = ["Committed", "Live", "TokenEvent", "count_cached", "emitted_rows", "new_text"]


@dataclass
class Live:
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


@dataclass
class Committed:
    """A step the scheduler has committed whose token events are not made yet (`Engine.finish_step`
    makes them): its plan, its samples on the host (None when it did not run: it yields no tokens),
    the scheduler's events, the tokens each sequence emits (None without drafting) and the events of
    the requests the commit failed (invalid rows)."""

    plan: StepPlan | None
    samples: Samples | None
    events: list[Any]
    num_emitted: np.ndarray | None = None
    failed: list[TokenEvent] = field(default_factory=list)


def new_text(live: Live, token: int, finished: bool) -> tuple[str, bool]:
    """Push `token` into the request's text: (the text to emit for it, never half a character nor a
    (partial) stop string; whether a stop string ended the request now, which sets `live.finish` to
    "stop": the caller frees its caches)."""
    p = live.params
    # stop strings count from min_tokens on (vLLM's rule); the text before stays searchable
    stops = p.stop if len(live.tokens) >= p.min_tokens else ()
    live.detok.push(token)
    if finished:
        live.detok.flush()
    full = live.detok.text
    cut = find_stop(full, stops, start=live.checked) if stops else None
    live.checked = len(full)
    stopped = cut is not None and not finished
    if stopped:
        live.finish = "stop"
    if cut is not None:
        live.stop_reason = next(s for s in stops if full.startswith(s, cut))
        cut += len(live.stop_reason) if p.include_stop_str_in_output else 0
    end = cut if cut is not None else len(full) - (0 if finished else stop_prefix_len(full, stops))
    text = full[live.emitted : max(end, live.emitted)]
    live.emitted = max(end, live.emitted)
    return text, stopped


def emitted_rows(plan: StepPlan, num_emitted: np.ndarray | None) -> dict[int, list[int]]:
    """Per request, the sample rows whose tokens it emits, in order (the first num_emitted rows of its
    sequence; one per sampling sequence without num_emitted)."""
    out: dict[int, list[int]] = {}
    for k, (a, n) in enumerate(zip(plan.verify_start.tolist(), plan.verify_len.tolist(), strict=True)):
        m = min(n, 1) if num_emitted is None else int(num_emitted[k])
        out.setdefault(int(plan.seq_rids[k]), []).extend(range(a, a + m))
    return out


def count_cached(plan: StepPlan, live: dict[int, Live], prefilling: set[int]) -> None:
    """Per-request prefix-cache hits, read off the plan: a hit of h tokens admits the request at
    start <= h (the replay start) and marks its rows below h is_replay, so h = the first chunk's
    start + its is_replay rows over all prefill chunks. Only requests still `prefilling` are looked at."""
    for rid in plan.preempted:  # readmitted later with a fresh lookup
        record = live.get(int(rid))
        if record is not None and int(rid) in prefilling:
            record.num_cached_tokens = None
    if not prefilling:
        return
    n = plan.num_tokens
    replay = np.bincount(
        np.asarray(plan.seq_ids[:n])[np.asarray(plan.is_replay[:n]) != 0], minlength=plan.num_seqs
    )
    starts = plan.seq_start
    for k, rid in enumerate(plan.seq_rids[: plan.num_seqs].tolist()):
        record = live.get(rid)
        if record is None or rid not in prefilling:
            continue
        if record.num_cached_tokens is None:
            record.num_cached_tokens = int(starts[k])
        record.num_cached_tokens += int(replay[k])
