"""
dsgraph's C++ runtime: bucket table, cache managers, prefix cache and the step scheduler.
"""

from collections.abc import Sequence
import enum
from typing import Annotated

import numpy
from numpy.typing import NDArray


def version() -> str:
    """The dsgraph package version this module was built for."""

class BucketTable:
    """Padded step sizes; a step of n rows runs in the smallest bucket >= n."""

    def __init__(self, sizes: Sequence[int]) -> None:
        """
        Build from positive, strictly increasing sizes (each at most 2**31 - 1).
        """

    @property
    def sizes(self) -> list[int]:
        """The bucket sizes, ascending."""

    def choose(self, n: int) -> int:
        """
        Smallest bucket >= n; ValueError when n <= 0 or n exceeds the largest bucket.
        """

    def choose_many(self, counts: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> Annotated[NDArray[numpy.int32], dict(shape=(None,))]:
        """
        choose() of every entry of a contiguous int32 CPU array, without the GIL; ValueError names the first bad entry's index.
        """

def pad_rows(n: int, bucket: int) -> int:
    """
    Padding rows that fill a bucket holding n real rows; ValueError unless 0 <= n <= bucket.
    """

class SlotPool:
    """State slots (SWA rings + compressor state), one owner each."""

    def __init__(self, num_slots: int) -> None: ...

    def allocate(self) -> int | None:
        """A free slot (least recently released first), or None."""

    def release(self, slot: int) -> None:
        """Frees a slot; ValueError when it is not in use."""

    def is_used(self, slot: int) -> bool: ...

    @property
    def num_total(self) -> int: ...

    @property
    def num_free(self) -> int: ...

    @property
    def num_used(self) -> int: ...

class PagePool:
    """Pages of one ratio's paged caches, with reference counts."""

    def __init__(self, num_pages: int) -> None: ...

    def allocate(self) -> int | None:
        """A free page with reference count 1, or None."""

    def retain(self, page: int) -> None:
        """Adds a reference; ValueError for a free page."""

    def release(self, page: int) -> bool:
        """
        Drops a reference; True when the count reached 0 and the page is free again.
        """

    def refcount(self, page: int) -> int: ...

    @property
    def num_total(self) -> int: ...

    @property
    def num_free(self) -> int: ...

    @property
    def num_used(self) -> int: ...

class PrefixCache:
    """
    Per-ratio page pools with hash-chained prompt pages and an LRU of idle ones.
    """

    def __init__(self, page_size: int, ratios: Sequence[int], num_pages: Sequence[int]) -> None: ...

    def allocate(self, ratio: int) -> int | None:
        """
        A free page, else an evicted idle cached page; None when neither exists.
        """

    def release(self, ratio: int, page: int) -> None: ...

    def refcount(self, ratio: int, page: int) -> int: ...

    def num_free(self, ratio: int) -> int: ...

    def num_available(self, ratio: int) -> int: ...

    def num_cached(self, ratio: int) -> int: ...

    def num_idle(self, ratio: int) -> int: ...

    def num_evicted(self, ratio: int) -> int:
        """Idle cached pages evicted so far to serve allocations."""

    def is_cached(self, ratio: int, page: int) -> bool: ...

    def cached_pages(self, ratio: int) -> list[int]: ...

    def match(self, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> int:
        """
        Tokens of the longest prefix cached for every ratio (a multiple of grain).
        """

    def acquire(self, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], hit: int) -> list[list[int]]:
        """
        Adds a user to the pages of the first `hit` tokens; returns them per ratio (ascending ratios).
        """

    def count_lookup(self, lookup: int, hit: int) -> None: ...

    def insert(self, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], ratio: int, index: int, page: int) -> bool:
        """
        Caches `page` as page `index` of the prompt's chain; False when that prefix or page is cached.
        """

    @property
    def grain(self) -> int: ...

    @property
    def lookup_tokens(self) -> int: ...

    @property
    def hit_tokens(self) -> int: ...

def hash_chain(tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], tokens_per_page: int) -> Annotated[NDArray[numpy.uint64], dict(shape=(None,))]:
    """Chain keys of the full pages of `tokens` (uint64)."""

class StepPlan:
    """
    One step's model inputs (flat-batch layout, rows padded to a bucket) and bookkeeping.
    """

    @property
    def step(self) -> int:
        """1 for a scheduler's first plan."""

    @property
    def bucket(self) -> int:
        """Padded row count; 0 for an empty plan (nothing to run)."""

    @property
    def num_tokens(self) -> int:
        """Real rows: the leading rows of every row array."""

    @property
    def num_decode(self) -> int:
        """
        Leading sequences that decode (one row, or a verify sequence's 1 + k rows).
        """

    @property
    def num_seqs(self) -> int: ...

    @property
    def ratios(self) -> list[int]:
        """Ratios with a block table, ascending."""

    @property
    def token_ids(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[bucket] int32; padding rows 0."""

    @property
    def token_src(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """
        [bucket] int32: the previous step's sample row whose token this row takes (overlapped scheduling; token_ids holds 0 there), else -1.
        """

    @property
    def positions(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[bucket] int32; padding rows 0."""

    @property
    def seq_ids(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[bucket] int32; padding rows -1."""

    @property
    def is_replay(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """
        [bucket] int32: 1 where a row recomputes entries a prefix hit holds; its compressed-cache writes must be skipped.
        """

    @property
    def seq_slot(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[seqs] int32 state slot."""

    @property
    def seq_start(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[seqs] int32 first position."""

    @property
    def seq_end(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[seqs] int32 one past the last position."""

    @property
    def seq_window_start(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """
        [seqs] int32 first position whose SWA key the request holds (its replay start after a prefix hit, else 0); attention reads no SWA key below it.
        """

    @property
    def seq_rids(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """[seqs] int64 request ids."""

    @property
    def sample_rows(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[outs] int32 rows to sample."""

    @property
    def sample_rids(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """[outs] int64 their request ids."""

    @property
    def verify_start(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """
        [seqs] int32 first sample row (index into sample_rows) of each sequence.
        """

    @property
    def verify_len(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """
        [seqs] int32 sample rows of each sequence: 0 (a chunk that samples nothing), 1, or 1 + the drafts it verifies.
        """

    @property
    def num_verify_drafts(self) -> int:
        """Drafts verified in this step."""

    @property
    def expected_tokens(self) -> float:
        """
        The planner's expected tokens emitted by the decode sequences (0 with drafting off).
        """

    @property
    def predicted_ms(self) -> float:
        """
        The curve's predicted step time for the planner's choice (0 without a curve).
        """

    @property
    def preempted(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """int64 ids of requests preempted while planning this step."""

    @property
    def lookback(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None, None), writable=False)]:
        """
        [seqs, lookback_len] int32, most recent token first, -1 before position 0.
        """

    @property
    def lookback_src(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None, None), writable=False)]:
        """[seqs, lookback_len] int32: as token_src, for the lookback entries."""

    def block_table(self, ratio: int) -> Annotated[NDArray[numpy.int32], dict(shape=(None, None), writable=False)]:
        """
        [seqs, pages_per_seq(ratio)] int32 pages of the ratio's caches, -1 = unallocated.
        """

class EngineType(enum.Enum):
    """
    NORMAL: prefill and decode; PROMPT: prefill only; COMPLETION: decode only.
    """

    NORMAL = 0

    PROMPT = 1

    COMPLETION = 2

class VerifyMode(enum.Enum):
    """
    OFF: no drafts; CONFIDENCE: the confidence planner chooses the verified drafts; FIXED: min(draft_len, drafts held) per request.
    """

    OFF = 0

    CONFIDENCE = 1

    FIXED = 2

class SchedulerConfig:
    """Scheduler settings; runtime/scheduler.py builds it."""

    def __init__(self) -> None: ...

    @property
    def engine_type(self) -> EngineType: ...

    @engine_type.setter
    def engine_type(self, arg: EngineType, /) -> None: ...

    @property
    def max_num_seqs(self) -> int: ...

    @max_num_seqs.setter
    def max_num_seqs(self, arg: int, /) -> None: ...

    @property
    def max_num_batched_tokens(self) -> int: ...

    @max_num_batched_tokens.setter
    def max_num_batched_tokens(self, arg: int, /) -> None: ...

    @property
    def max_model_len(self) -> int: ...

    @max_model_len.setter
    def max_model_len(self, arg: int, /) -> None: ...

    @property
    def page_size(self) -> int: ...

    @page_size.setter
    def page_size(self, arg: int, /) -> None: ...

    @property
    def ratios(self) -> list[int]: ...

    @ratios.setter
    def ratios(self, arg: Sequence[int], /) -> None: ...

    @property
    def num_pages(self) -> list[int]: ...

    @num_pages.setter
    def num_pages(self, arg: Sequence[int], /) -> None: ...

    @property
    def num_slots(self) -> int: ...

    @num_slots.setter
    def num_slots(self, arg: int, /) -> None: ...

    @property
    def buckets(self) -> list[int]: ...

    @buckets.setter
    def buckets(self, arg: Sequence[int], /) -> None: ...

    @property
    def lookback_len(self) -> int: ...

    @lookback_len.setter
    def lookback_len(self, arg: int, /) -> None: ...

    @property
    def vocab_size(self) -> int: ...

    @vocab_size.setter
    def vocab_size(self, arg: int, /) -> None: ...

    @property
    def enable_prefix_cache(self) -> bool: ...

    @enable_prefix_cache.setter
    def enable_prefix_cache(self, arg: bool, /) -> None: ...

    @property
    def replay_tokens(self) -> int: ...

    @replay_tokens.setter
    def replay_tokens(self, arg: int, /) -> None: ...

    @property
    def verify_mode(self) -> VerifyMode: ...

    @verify_mode.setter
    def verify_mode(self, arg: VerifyMode, /) -> None: ...

    @property
    def nextn(self) -> int: ...

    @nextn.setter
    def nextn(self, arg: int, /) -> None: ...

    @property
    def draft_len(self) -> int: ...

    @draft_len.setter
    def draft_len(self, arg: int, /) -> None: ...

class Allocation:
    """A request's state slot and pages, holding its first num_cached tokens."""

    @property
    def rid(self) -> int: ...

    @property
    def slot(self) -> int: ...

    @property
    def pages(self) -> list[list[int]]:
        """Pages per ratio (ascending ratios), in sequence order."""

    @property
    def num_cached(self) -> int: ...

    @property
    def tokens(self) -> list[int]:
        """Prompt then output tokens."""

class Scheduler:
    """Continuous-batching step scheduler (see runtime/csrc/scheduler.h)."""

    def __init__(self, config: SchedulerConfig, curve: ThroughputCurve | None = None) -> None:
        """
        curve: the confidence planner's throughput curve, shared (observe() on it corrects the planner); required when config.verify_mode is CONFIDENCE.
        """

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def draft_ms(self) -> float:
        """
        The draft pass (ms) a drafting plan pays on top of its verify step, every depth alike (reads the deepest pass's cost); a plan verifying nothing pays none.
        """

    @draft_ms.setter
    def draft_ms(self, arg: float, /) -> None: ...

    @property
    def draft_depth_ms(self) -> list[float]:
        """
        The draft pass (ms) by depth: entry D - 1 for a pass drafting D tokens per request.
        """

    @draft_depth_ms.setter
    def draft_depth_ms(self, arg: Sequence[float], /) -> None: ...

    def add_request(self, rid: int, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], max_tokens: int, eos_id: int = -1, ignore_eos: bool = False, stop_token_ids: Sequence[int] = [], use_prefix_cache: bool = True, max_chunk: int = 0) -> None:
        """
        Queue a request; ValueError names the bad field (prompt too long, token id < 0, max_tokens < 1, ...). use_prefix_cache=False: it neither reads nor fills the prefix cache. max_chunk > 0: no step prefills more than that many of its tokens.
        """

    def add_prefilled(self, rid: int, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], output: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], max_tokens: int, eos_id: int = -1, ignore_eos: bool = False, stop_token_ids: Sequence[int] = []) -> Allocation:
        """
        Admit a request whose caches (all tokens but the newest) are filled elsewhere; returns where to fill them. RuntimeError when there is no room (see can_add_prefilled).
        """

    def can_add_prefilled(self, num_tokens: int) -> bool: ...

    def abort(self, rid: int) -> bool:
        """Finish with reason 'abort' (reported by the next update())."""

    def preempt(self, rid: int) -> bool:
        """Preempt a request holding a slot now (recompute later)."""

    def schedule(self) -> StepPlan:
        """Plan the next step (one call per step, then update())."""

    def update(self, sampled: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], num_emitted: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None, drafts: Annotated[NDArray[numpy.int32], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None = None, draft_lengths: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None, confidence: Annotated[NDArray[numpy.float64], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None = None) -> list[tuple[int, int, bool, str | None]]:
        """
        Commit the step: int32 sampled [sample rows]; optional int32 num_emitted [seqs] (default one per sampling sequence), the next drafts int32 [seqs, nextn] with int32 draft_lengths [seqs] and float64 confidence [seqs, nextn]. Returns (rid, token, finished, reason) per emitted token, after pending aborts (token -1). ValueError names the bad entry; nothing changes then.
        """

    def advance(self, sampled: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], num_emitted: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None, drafts: Annotated[NDArray[numpy.int32], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None = None, draft_lengths: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None, confidence: Annotated[NDArray[numpy.float64], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None = None) -> tuple[list[tuple[int, int, bool, str | None]], StepPlan]:
        """
        update(...) then schedule() in one call: (events of the committed step, the next plan).
        """

    def advance_ahead(self, sampled: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> tuple[list[tuple[int, int, bool, str | None]], StepPlan]:
        """
        Overlapped step: resolve(sampled) the step awaiting its tokens (none: sampled empty, pending aborts returned), commit the plan in flight before its tokens are known (commit_ahead), plan the next step: (events of the resolved step, the next plan).
        """

    def commit_ahead(self) -> None:
        """
        Commit the plan in flight with its sampled tokens still unknown (resolve() gives them).
        """

    def resolve(self, sampled: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> list[tuple[int, int, bool, str | None]]:
        """
        int32 tokens of the step commit_ahead() committed, one per sample row: (rid, token, finished, reason) per emitted token, after pending aborts (token -1).
        """

    @property
    def has_unresolved(self) -> bool: ...

    @property
    def done_step(self) -> int:
        """Every step up to this one has run and is committed with its tokens."""

    def drafts_of(self, rid: int) -> list[int]:
        """The drafts a request holds now."""

    def allocation(self, rid: int) -> Allocation: ...

    def handoff(self, rid: int) -> Allocation:
        """A PROMPT engine's finished request: its slot and pages."""

    def release_handoff(self, rid: int) -> None: ...

    def prefix_pages(self, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> list[list[int]]:
        """Per ratio: the pages of the prompt's leading full pages cached now."""

    def import_prefix(self, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], counts: Sequence[int]) -> list[list[int]]:
        """
        Cache the first counts[i] pages of ratio i's chain of the prompt (store import): per ratio, a fresh page to fill with the block's bytes, or -1 where cached already; a ratio stops at the first page it cannot get.
        """

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_handoff(self) -> int: ...

    @property
    def num_requests(self) -> int: ...

    @property
    def has_unfinished(self) -> bool: ...

    @property
    def num_preemptions(self) -> int: ...

    @property
    def num_replayed_tokens(self) -> int: ...

    @property
    def prefix_lookup_tokens(self) -> int: ...

    @property
    def prefix_hit_tokens(self) -> int: ...

    @property
    def num_free_slots(self) -> int: ...

    def num_free_pages(self, ratio: int) -> int: ...

    def num_used_pages(self, ratio: int) -> int:
        """Pages with a reference: held by requests or by the prefix cache."""

    def num_cached_pages(self, ratio: int) -> int: ...

    def num_idle_pages(self, ratio: int) -> int:
        """Cached pages no request uses (evictable)."""

    def num_evicted_pages(self, ratio: int) -> int:
        """Idle cached pages evicted so far to serve allocations."""

    def cached_pages(self, ratio: int) -> list[int]: ...

    def page_refcounts(self, ratio: int) -> Annotated[NDArray[numpy.int32], dict(shape=(None,))]:
        """Reference count of every page of the ratio (a copy)."""

class CurveLookup(enum.Enum):
    """
    STEP: a step of n rows costs the first profiled size >= n (padded buckets); LINEAR: linear interpolation between profiled sizes (eager platforms).
    """

    STEP = 0

    LINEAR = 1

class ThroughputCurve:
    """
    Profiled (rows per step -> step ms) points with an online per-row slope correction; runtime/csrc/spec_curve.h documents the estimator.
    """

    def __init__(self, sizes: Sequence[int], step_ms: Sequence[float], lookup: CurveLookup = CurveLookup.STEP, window: int = 5000, min_samples: int = 10, min_fraction: float = 0.1) -> None:
        """ValueError names the first bad size, time or correction setting."""

    @property
    def sizes(self) -> list[int]:
        """Profiled row counts, ascending."""

    @property
    def step_ms(self) -> list[float]:
        """Profiled step times (ms), one per size."""

    @property
    def lookup(self) -> CurveLookup: ...

    @property
    def largest(self) -> int: ...

    @property
    def window(self) -> int: ...

    @property
    def min_samples(self) -> int: ...

    @property
    def min_fraction(self) -> float: ...

    @property
    def slope_ms(self) -> float:
        """Current per-row correction (ms)."""

    @property
    def min_slope_ms(self) -> float: ...

    @property
    def num_samples(self) -> int:
        """Samples in the window."""

    def profiled(self, n: int) -> float:
        """Profiled time of n rows, uncorrected."""

    def predict(self, n: int) -> float:
        """Corrected time of n rows (ms), always > 0."""

    def observe(self, n: int, measured_ms: float) -> None:
        """Record a measured step of n real rows and refit the slope."""

    def reset(self) -> None:
        """Forget every sample (slope 0)."""

class VerifyPlan:
    """Drafts each request verifies this step, and the plan's value."""

    @property
    def drafts(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]:
        """[requests] int32, a read-only view alive as long as the plan."""

    @property
    def total_drafts(self) -> int: ...

    @property
    def num_rows(self) -> int:
        """requests + other_rows + total_drafts."""

    @property
    def expected_tokens(self) -> float: ...

    @property
    def step_ms(self) -> float:
        """Predicted step time; 0 without a curve."""

    @property
    def draft_ms(self) -> float:
        """The draft pass the plan pays for (0: it drafts nothing)."""

def cumulative_acceptance(conf: Annotated[NDArray[numpy.float64], dict(shape=(None, None), order='C', device='cpu', writable=False)], lengths: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> Annotated[NDArray[numpy.float64], dict(shape=(None, None))]:
    """
    [requests, nextn] float64 cumulative products (0 past a request's length).
    """

def split_drafts(conf: Annotated[NDArray[numpy.float64], dict(shape=(None, None), order='C', device='cpu', writable=False)], lengths: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], total: int) -> Annotated[NDArray[numpy.int32], dict(shape=(None,))]:
    """
    Drafts per request when `total` drafts go to the largest cumulative probabilities.
    """

def plan_verification(conf: Annotated[NDArray[numpy.float64], dict(shape=(None, None), order='C', device='cpu', writable=False)], lengths: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], curve: ThroughputCurve, max_total: int, other_rows: int = 0, fixed_ms: float = 0.0, draft_ms: Sequence[float] = []) -> VerifyPlan:
    """
    The drafts maximising expected tokens / (predicted time + fixed_ms + the draft pass by depth, paid only by a plan that verifies drafts), split by the greedy prefix.
    """

def plan_fixed(conf: Annotated[NDArray[numpy.float64], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None, lengths: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], draft_len: int, curve: ThroughputCurve | None, max_total: int, other_rows: int = 0) -> VerifyPlan:
    """
    Every request verifies min(draft_len, its drafts), trimmed to max_total.
    """

class SpecStatsSnapshot:
    """
    Totals and rates (NaN where undefined); runtime/csrc/spec_stats.h defines them.
    """

    @property
    def steps(self) -> int: ...

    @property
    def sequences(self) -> int: ...

    @property
    def verified_tokens(self) -> int: ...

    @property
    def accepted_tokens(self) -> int: ...

    @property
    def accept_rate(self) -> float: ...

    @property
    def mean_accepted_len(self) -> float: ...

    @property
    def mean_verified_len(self) -> float: ...

    @property
    def verified_at(self) -> list[int]: ...

    @property
    def reached_at(self) -> list[int]: ...

    @property
    def accepted_at(self) -> list[int]: ...

    @property
    def position_accept_rate(self) -> list[float]: ...

    @property
    def position_conditional_rate(self) -> list[float]: ...

    @property
    def calibration_count(self) -> int: ...

    @property
    def calibration_mae(self) -> float: ...

    @property
    def calibration_ece(self) -> float: ...

    @property
    def bin_count(self) -> list[int]: ...

    @property
    def bin_confidence(self) -> list[float]: ...

    @property
    def bin_acceptance(self) -> list[float]: ...

class SpecStats:
    """Accumulates verify outcomes: acceptance per position, calibration."""

    def __init__(self, nextn: int, num_bins: int = 10) -> None: ...

    @property
    def nextn(self) -> int: ...

    @property
    def num_bins(self) -> int: ...

    def record(self, verified: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], accepted: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], conf: Annotated[NDArray[numpy.float64], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None = None) -> None:
        """
        One verify step: int32 [requests] verified and accepted drafts, optional float64 [requests, nextn] conditional confidences; ValueError names the bad request.
        """

    def snapshot(self) -> SpecStatsSnapshot: ...

    def reset(self) -> None: ...

class ReplayTable:
    """
    Captured bucket programs by key, launched from C++ in one call per step.
    """

    def __init__(self) -> None: ...

    def add(self, key: Sequence[int], phases: list) -> None:
        """
        Register a bucket: its key (ints) and phases in order, each a cudaGraphExec_t handle (int) or a callable run on the host.
        """

    def launch(self, key: Sequence[int], stream: int = 0) -> None:
        """
        Run the bucket's phases: graphs through cuGraphLaunch on `stream` (a CUstream handle; the driver is opened with dlopen on first use), callables in between; IndexError for an unknown bucket, RuntimeError naming the CUresult of a failed launch.
        """

    def __contains__(self, key: Sequence[int]) -> bool: ...

    def __len__(self) -> int: ...

def cuda_driver_available() -> bool:
    """Whether the CUDA driver's cuGraphLaunch can be loaded on this machine."""
