"""Typed Python face of the C++ step scheduler (`dsgraph.runtime._native.Scheduler`).

The scheduler plans one step per `schedule()` call: a decode row for every running request, then
prefill chunks of waiting requests in FCFS order within `max_num_batched_tokens`; `update(sampled)`
commits the step. With overlapped scheduling `advance_ahead` commits a step before its tokens are
known and plans the next one, and `resolve` (inside the following `advance_ahead`) writes them.
Policies (preemption victim, prefix-cache replay, finish reasons, overlap) are documented in
`runtime/csrc/scheduler.h`. This module adds the config dataclass, argument conversion and the
mapping from a `StepPlan` to the model's step inputs (`models/deepseek_v41/step_io.py`).

Speculative decoding (`verify_mode` "confidence" or "fixed"): a commit may hand the scheduler each
sampling sequence's next drafts and their confidences; the next plan then gives a decoding request the
rows [newest token, d_0 .. d_{k-1}], k chosen inside the same native call by the confidence planner
(`runtime/spec_schedule.py`) or the fixed length, and `StepPlan.verify_start` / `verify_len` say which
sample rows belong to which sequence (the `spec_verify` layout). The commit then takes the tokens each
sequence emitted (`num_emitted`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

from dsgraph.runtime import _native
from dsgraph.runtime._native import Allocation, EngineType, StepPlan, ThroughputCurve, VerifyMode
from dsgraph.runtime.engine_config import CacheConfig, EngineConfig, SchedulingConfig

if TYPE_CHECKING:
    from dsgraph.models.interface import Model as V41Model

__all__ = [
    "Allocation",
    "EngineType",
    "PageUsage",
    "Scheduler",
    "SchedulerConfig",
    "StepEvent",
    "StepPlan",
    "VerifyMode",
    "default_buckets",
    "model_inputs",
    "replay_tokens",
]

ReplayMode = Literal["window", "exact"]
VerifyName = Literal["off", "confidence", "fixed"]
INT32_MAX = 2**31 - 1
DEFAULT_NEXTN = 5  # DSpark's block size: drafts per request
_VERIFY_MODES = {"off": VerifyMode.OFF, "confidence": VerifyMode.CONFIDENCE, "fixed": VerifyMode.FIXED}


def replay_tokens(mode: ReplayMode | int, *, window: int, num_layers: int) -> int:
    """Tokens of a prefix hit to recompute (spec 5.6 item 1). "window": the sliding window, the bounded
    approximation; "exact": window * num_layers, enough that every layer's SWA state equals a cold run
    (stale state reaches at most window - 1 positions further per layer); an int: that many tokens."""
    if isinstance(mode, int) and not isinstance(mode, bool):
        if mode < 0:
            raise ValueError(f"replay: {mode} must be >= 0")
        return mode
    if mode == "window":
        return window
    if mode == "exact":
        return window * num_layers
    raise ValueError(f"replay: {mode!r} must be 'window', 'exact' or a token count >= 0")


def default_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    """Powers of two below `max_num_batched_tokens`, then that limit itself."""
    sizes, size = [], 1
    while size < max_num_batched_tokens:
        sizes.append(size)
        size *= 2
    return (*sizes, max_num_batched_tokens)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Scheduler settings; `for_model` derives the cache layout from a model. The C++ side validates
    and names the bad field (`SchedulerConfig.<field> = <value> ...`)."""

    # the limits' and the geometry's defaults are EngineConfig's own (one source: a scheduler built
    # without an engine pages the caches as the engine would); the engine's comes from
    # derived_configs.scheduler_config
    engine_type: EngineType = EngineType.NORMAL
    max_num_seqs: int = SchedulingConfig.max_num_seqs
    max_num_batched_tokens: int = SchedulingConfig.max_num_batched_tokens
    max_model_len: int = EngineConfig.max_model_len
    page_size: int = CacheConfig.page_size
    ratios: tuple[int, ...] = (1, 2)
    num_pages: tuple[int, ...] = (256, 256)
    num_slots: int | None = None  # None: max_num_seqs
    buckets: tuple[int, ...] | None = None  # None: default_buckets(max_num_batched_tokens)
    lookback_len: int = 3
    vocab_size: int = 0  # 0: token ids are only checked to be >= 0
    enable_prefix_cache: bool = True
    replay_tokens: int = 0
    # Speculative decoding: "off", "confidence" (needs a throughput curve) or "fixed" (draft_len per
    # request); nextn drafts at most per request (the model's ROLLBACK_ROOM - 1 bounds it).
    verify_mode: VerifyName = "off"
    nextn: int = DEFAULT_NEXTN
    draft_len: int | None = None  # None: nextn

    def __post_init__(self) -> None:
        if self.verify_mode not in _VERIFY_MODES:
            raise ValueError(
                f"SchedulerConfig.verify_mode = {self.verify_mode!r}; expected one of {sorted(_VERIFY_MODES)}"
            )

    @classmethod
    def for_model(
        cls,
        model: V41Model,
        *,
        num_pages: int | Sequence[int],
        replay: ReplayMode | int = "window",
        **kw: object,
    ) -> SchedulerConfig:
        """Cache layout, lookback, vocabulary and replay length from `model`; other fields from `kw`."""
        from dsgraph.models.interface import ROLLBACK_ROOM, ratios

        nextn = kw.get("nextn", DEFAULT_NEXTN)
        in_room = isinstance(nextn, int) and 1 <= nextn <= ROLLBACK_ROOM - 1
        if kw.get("verify_mode", "off") != "off" and not in_room:
            # verify rows write positions a..a+nextn; the caches roll back ROLLBACK_ROOM entries at most
            raise ValueError(
                f"SchedulerConfig.nextn = {nextn}; expected 1..{ROLLBACK_ROOM - 1} (ROLLBACK_ROOM - 1)"
            )

        text, geo = model.cfg.text, model.geo
        rs = ratios(model.plans)
        pages = (num_pages,) * len(rs) if isinstance(num_pages, int) else tuple(num_pages)
        derived: dict[str, object] = dict(
            max_model_len=geo.max_model_len,
            page_size=geo.page_size,
            ratios=rs,
            num_pages=pages,
            lookback_len=text.engram_max_ngram_size - 1,
            vocab_size=text.vocab_size,
            replay_tokens=replay_tokens(
                replay, window=text.sliding_window, num_layers=text.num_hidden_layers
            ),
        )
        return cls(**{**derived, **kw})  # type: ignore[arg-type]

    def to_native(self) -> _native.SchedulerConfig:
        c = _native.SchedulerConfig()
        c.engine_type = self.engine_type
        c.max_num_seqs = self.max_num_seqs
        c.max_num_batched_tokens = self.max_num_batched_tokens
        c.max_model_len = self.max_model_len
        c.page_size = self.page_size
        c.ratios = list(self.ratios)
        c.num_pages = list(self.num_pages)
        c.num_slots = self.max_num_seqs if self.num_slots is None else self.num_slots
        c.buckets = list(self.buckets or default_buckets(self.max_num_batched_tokens))
        c.lookback_len = self.lookback_len
        c.vocab_size = self.vocab_size
        c.enable_prefix_cache = self.enable_prefix_cache
        c.replay_tokens = self.replay_tokens
        c.verify_mode = _VERIFY_MODES[self.verify_mode]
        c.nextn = self.nextn
        c.draft_len = self.nextn if self.draft_len is None else self.draft_len
        return c


class StepEvent(NamedTuple):
    rid: int
    token: int  # -1 for an abort
    finished: bool
    reason: str | None  # "stop", "length", "abort", "prefilled" (PROMPT engine) or None


class PageUsage(NamedTuple):
    total: int
    free: int
    used: int  # referenced by requests or the prefix cache: free + used == total
    cached: int  # in the prefix cache (a subset of used)
    idle: int  # cached with no request using them: evicted when pages run out


def as_tokens(values: Sequence[int] | np.ndarray, field: str) -> np.ndarray:
    """`values` as a contiguous int32 vector; ValueError names `field` for a value outside int32."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{field}: expected a 1-d sequence of token ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{field}: expected integer token ids, got dtype {arr.dtype}")
    if arr.size and (arr.min() < -INT32_MAX - 1 or arr.max() > INT32_MAX):
        bad = int(arr.max()) if arr.max() > INT32_MAX else int(arr.min())
        raise ValueError(f"{field}: token id {bad} is outside the int32 range")
    return np.ascontiguousarray(arr, dtype=np.int32)


DraftsArg = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def commit_arrays(
    sampled: Sequence[int] | np.ndarray,
    num_emitted: Sequence[int] | np.ndarray | None,
    drafts: DraftsArg | None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """The native commit's arrays. `drafts` = (tokens [seqs, nextn], lengths [seqs], confidences
    [seqs, nextn] or None), one row per sequence of the committed plan."""
    emitted = None if num_emitted is None else as_tokens(num_emitted, "num_emitted")
    if drafts is None:
        return as_tokens(sampled, "sampled"), emitted, None, None, None
    tokens, lengths, conf = drafts
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    if tokens.ndim != 2:
        raise ValueError(f"drafts: expected a [seqs, nextn] array, got shape {tokens.shape}")
    c = None if conf is None else np.ascontiguousarray(conf, dtype=np.float64)
    return as_tokens(sampled, "sampled"), emitted, tokens, as_tokens(lengths, "draft_lengths"), c


class Scheduler:
    """Continuous-batching scheduler over the C++ core; one `schedule()` and one `update()` per step."""

    def __init__(self, config: SchedulerConfig, curve: ThroughputCurve | None = None) -> None:
        """`curve`: the confidence planner's throughput curve, shared with the caller (its `observe`
        corrections reach the planner); required with verify_mode "confidence"."""
        self.config = config
        self.native = _native.Scheduler(config.to_native(), curve)

    def add_request(
        self,
        rid: int,
        prompt: Sequence[int] | np.ndarray,
        *,
        max_tokens: int,
        eos_id: int = -1,
        ignore_eos: bool = False,
        stop_token_ids: Sequence[int] = (),
        use_prefix_cache: bool = True,
        max_chunk: int = 0,
    ) -> None:
        """Queue a request; `use_prefix_cache` False: it neither reads nor fills the prefix cache;
        `max_chunk` > 0: no step prefills more than that many of its tokens (0: the step budget alone)."""
        tokens = as_tokens(prompt, "prompt")
        self.native.add_request(
            rid, tokens, max_tokens, eos_id, ignore_eos, list(stop_token_ids), use_prefix_cache, max_chunk
        )

    def add_prefilled(
        self,
        rid: int,
        prompt: Sequence[int] | np.ndarray,
        output: Sequence[int] | np.ndarray,
        *,
        max_tokens: int,
        eos_id: int = -1,
        ignore_eos: bool = False,
        stop_token_ids: Sequence[int] = (),
    ) -> Allocation:
        """Admit a request whose caches were filled elsewhere; returns the slot and pages to fill."""
        p, o = as_tokens(prompt, "prompt"), as_tokens(output, "output")
        return self.native.add_prefilled(rid, p, o, max_tokens, eos_id, ignore_eos, list(stop_token_ids))

    def can_add_prefilled(self, num_tokens: int) -> bool:
        """Whether add_prefilled() of a request with `num_tokens` cached tokens would find room now."""
        return self.native.can_add_prefilled(num_tokens)

    def abort(self, rid: int) -> bool:
        return self.native.abort(rid)

    def preempt(self, rid: int) -> bool:
        return self.native.preempt(rid)

    def schedule(self) -> StepPlan:
        return self.native.schedule()

    def update(
        self,
        sampled: Sequence[int] | np.ndarray,
        num_emitted: Sequence[int] | np.ndarray | None = None,
        drafts: DraftsArg | None = None,
    ) -> list[StepEvent]:
        """Commit the step: `sampled` one token per sample row; `num_emitted` per plan sequence (None:
        one per sampling sequence); `drafts` the next drafts (see `commit_arrays`). One event per
        emitted token."""
        args = commit_arrays(sampled, num_emitted, drafts)
        return [StepEvent(*e) for e in self.native.update(*args)]

    def advance(
        self,
        sampled: Sequence[int] | np.ndarray,
        num_emitted: Sequence[int] | np.ndarray | None = None,
        drafts: DraftsArg | None = None,
    ) -> tuple[list[StepEvent], StepPlan]:
        """`update(...)` then `schedule()` in one native call: the engine's one crossing per step."""
        events, plan = self.native.advance(*commit_arrays(sampled, num_emitted, drafts))
        return [StepEvent(*e) for e in events], plan

    def advance_ahead(self, sampled: Sequence[int] | np.ndarray) -> tuple[list[StepEvent], StepPlan]:
        """Overlapped step, one native call: resolve the step awaiting its tokens (`sampled`, one per sample
        row; empty when none awaits), commit the plan in flight before its tokens are known, plan the next
        step (its rows after an unknown token carry `token_src`)."""
        events, plan = self.native.advance_ahead(as_tokens(sampled, "sampled"))
        return [StepEvent(*e) for e in events], plan

    def resolve(self, sampled: Sequence[int] | np.ndarray) -> list[StepEvent]:
        """The tokens of the step committed ahead (one per sample row): its events."""
        return [StepEvent(*e) for e in self.native.resolve(as_tokens(sampled, "sampled"))]

    @property
    def has_unresolved(self) -> bool:
        return self.native.has_unresolved

    def drafts_of(self, rid: int) -> list[int]:
        return list(self.native.drafts_of(rid))

    def handoff(self, rid: int) -> Allocation:
        return self.native.handoff(rid)

    def release_handoff(self, rid: int) -> None:
        self.native.release_handoff(rid)

    @property
    def num_waiting(self) -> int:
        return self.native.num_waiting

    @property
    def num_running(self) -> int:
        return self.native.num_running

    @property
    def has_unfinished(self) -> bool:
        return self.native.has_unfinished

    def page_usage(self, ratio: int) -> PageUsage:
        n = self.native
        free, used = n.num_free_pages(ratio), n.num_used_pages(ratio)
        return PageUsage(free + used, free, used, n.num_cached_pages(ratio), n.num_idle_pages(ratio))


def model_inputs(plan: StepPlan) -> dict[str, np.ndarray]:
    """The plan's arrays under the step input names of `models/deepseek_v41/step_io.py` (read-only
    views; request ids and the bucket are not model inputs and are left out)."""
    out = {
        "token_ids": plan.token_ids,
        "positions": plan.positions,
        "seq_ids": plan.seq_ids,
        "seq_slot": plan.seq_slot,
        "seq_start": plan.seq_start,
        "seq_end": plan.seq_end,
        "seq_window_start": plan.seq_window_start,
        "lookback": plan.lookback,
        "sample_rows": plan.sample_rows,
        "is_replay": plan.is_replay,
    }
    for r in plan.ratios:
        out[f"block_table_r{r}"] = plan.block_table(r)
    return out
