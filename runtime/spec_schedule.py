"""Confidence-scheduled verification: the Python face of `runtime/csrc/spec_{curve,schedule,stats}.h`.

Each verify step the planner picks the total number of draft tokens T that maximises expected emitted
tokens per predicted second, `(N + sum of chosen cumulative acceptance probabilities) / curve(N + T)`,
and splits T across the N requests by the greedy prefix (the T largest cumulative probabilities, ties
to the lower request); `runtime/csrc/spec_schedule.h` proves the greedy optimal for every T. The
throughput curve comes from `profile_curve` (a callable that runs one step of n rows and returns its
time, so cpu and cuda sessions profile the same way), is cached on disk by `save_curve`/`load_curve`
under a sha256 of (model config, buckets, device name), and is corrected online by
`ThroughputCurve.observe` (estimator in `runtime/csrc/spec_curve.h`). `SpecStats` accumulates
per-position acceptance and the confidence head's calibration for outputs and logs.

Confidences are per request: a sequence of conditional acceptance probabilities (one per draft the
request holds), or None / empty for a request without drafts (first step after prefill), which
verifies no drafts, as DeepInfer gives fresh sequences confidence 0.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from dsgraph.runtime import _native
from dsgraph.runtime._native import CurveLookup, SpecStatsSnapshot, ThroughputCurve, VerifyPlan

__all__ = [
    "CurveLookup",
    "SpecScheduleConfig",
    "SpecStats",
    "ThroughputCurve",
    "VerifyPlan",
    "VerifyScheduler",
    "as_confidences",
    "curve_cache_key",
    "curve_path",
    "load_curve",
    "load_or_profile_curve",
    "make_curve",
    "plan_fixed",
    "plan_rate",
    "plan_verification",
    "profile_curve",
    "save_curve",
    "snapshot_dict",
    "split_drafts",
    "wall_clock",
]

Lookup = Literal["step", "linear"]
Mode = Literal["confidence", "fixed"]
Confidences = Sequence[Sequence[float] | np.ndarray | None] | np.ndarray
CURVE_FORMAT = "dsgraph-throughput-curve"
CURVE_VERSION = 1
_LOOKUPS = {"step": CurveLookup.STEP, "linear": CurveLookup.LINEAR}


def make_curve(
    sizes: Sequence[int],
    step_ms: Sequence[float],
    *,
    lookup: Lookup = "step",
    window: int = 5000,
    min_samples: int = 10,
    min_fraction: float = 0.1,
) -> ThroughputCurve:
    """A curve over profiled points; "step" costs a step of n rows as the first size >= n (padded
    buckets, DeepInfer's lookup), "linear" interpolates (eager platforms)."""
    if lookup not in _LOOKUPS:
        raise ValueError(f"lookup: {lookup!r} must be one of {sorted(_LOOKUPS)}")
    return ThroughputCurve(
        [int(s) for s in sizes],
        [float(t) for t in step_ms],
        _LOOKUPS[lookup],
        window=window,
        min_samples=min_samples,
        min_fraction=min_fraction,
    )


def wall_clock(run: Callable[[int], object]) -> Callable[[int], float]:
    """`run(n)` timed by the host clock in ms: a `profile_curve` callable for synchronous (cpu) steps.
    A cuda session times with events instead, after its own synchronisation."""

    def timed(n: int) -> float:
        start = time.perf_counter()
        run(n)
        return (time.perf_counter() - start) * 1e3

    return timed


def profile_curve(
    run_step: Callable[[int], float],
    buckets: Sequence[int],
    repeats: int = 5,
    *,
    warmup: int = 1,
    lookup: Lookup = "step",
) -> ThroughputCurve:
    """Times every bucket, largest first (as DeepInfer: the largest allocates what the rest reuse):
    `warmup` untimed calls, then `repeats` timed ones; the bucket's time is the mean after dropping the
    fastest and the slowest. `run_step(n)` runs one step of n rows and returns its time in ms."""
    if repeats < 3:
        raise ValueError(f"repeats: {repeats} must be >= 3 (the fastest and slowest are dropped)")
    if warmup < 0:
        raise ValueError(f"warmup: {warmup} must be >= 0")
    sizes = sorted(int(b) for b in buckets)
    if not sizes or sizes[0] <= 0 or len(set(sizes)) != len(sizes):
        raise ValueError(f"buckets: {list(buckets)} must be distinct positive row counts, at least one")
    step_ms: dict[int, float] = {}
    for n in reversed(sizes):
        for _ in range(warmup):
            run_step(n)
        times = sorted(_checked_time(run_step(n), n) for _ in range(repeats))
        step_ms[n] = sum(times[1:-1]) / (repeats - 2)
        if step_ms[n] <= 0:
            raise ValueError(f"profile_curve: bucket {n}: mean step time {step_ms[n]} ms is not > 0")
    return make_curve(sizes, [step_ms[n] for n in sizes], lookup=lookup)


def _checked_time(ms: object, n: int) -> float:
    if not isinstance(ms, int | float) or not math.isfinite(ms) or ms < 0:
        raise ValueError(f"profile_curve: run_step({n}) returned {ms!r}; expected a finite time in ms >= 0")
    return float(ms)


def curve_cache_key(
    model_config: Mapping[str, object] | str, buckets: Sequence[int], device_name: str
) -> str:
    """sha256 (hex) of the model config (a JSON-able mapping, or its text), the buckets and the device
    name: any change to them keys a new profile."""
    config = model_config if isinstance(model_config, str) else json.dumps(model_config, sort_keys=True)
    fields = {"version": CURVE_VERSION, "model_config": config, "device": device_name}
    blob = json.dumps({**fields, "buckets": [int(b) for b in buckets]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def curve_path(cache_dir: str | os.PathLike[str], key: str) -> Path:
    return Path(cache_dir) / f"throughput-{key}.json"


def save_curve(
    curve: ThroughputCurve, cache_dir: str | os.PathLike[str], key: str, *, device_name: str = ""
) -> Path:
    """Writes the profiled points (not the online correction, which belongs to one run) atomically."""
    path = curve_path(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "format": CURVE_FORMAT,
        "version": CURVE_VERSION,
        "key": key,
        "device": device_name,
        "created": time.time(),
        "lookup": "step" if curve.lookup == CurveLookup.STEP else "linear",
        "sizes": list(curve.sizes),
        "step_ms": list(curve.step_ms),
    }
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path


def load_curve(
    cache_dir: str | os.PathLike[str], key: str, *, max_age_s: float | None = None
) -> ThroughputCurve | None:
    """The cached curve of `key`; None when there is none or it is older than `max_age_s`. A file that
    exists but does not hold a curve of this key raises ValueError naming the file and the field."""
    path = curve_path(cache_dir, key)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
    expected = {"format": CURVE_FORMAT, "version": CURVE_VERSION, "key": key}
    for field, want in expected.items():
        if not isinstance(record, dict) or record.get(field) != want:
            found = record.get(field) if isinstance(record, dict) else record
            raise ValueError(f"{path}: field {field!r} is {found!r}; expected {want!r}")
    if max_age_s is not None and time.time() - float(record.get("created", 0.0)) > max_age_s:
        return None
    try:
        return make_curve(record["sizes"], record["step_ms"], lookup=record["lookup"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad curve ({type(e).__name__}: {e})") from e


def load_or_profile_curve(
    run_step: Callable[[int], float],
    buckets: Sequence[int],
    *,
    cache_dir: str | os.PathLike[str] | None,
    model_config: Mapping[str, object] | str,
    device_name: str,
    repeats: int = 5,
    lookup: Lookup = "step",
) -> ThroughputCurve:
    """The cached curve when there is one, else a fresh profile (saved when `cache_dir` is set)."""
    key = curve_cache_key(model_config, buckets, device_name)
    if cache_dir is not None and (curve := load_curve(cache_dir, key)) is not None:
        return curve
    curve = profile_curve(run_step, buckets, repeats, lookup=lookup)
    if cache_dir is not None:
        save_curve(curve, cache_dir, key, device_name=device_name)
    return curve


def as_confidences(conf: Confidences, nextn: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(float64 [requests, nextn] conditional probabilities, int32 [requests] drafts held). A 2-d
    array means every request holds nextn drafts; a sequence may hold None/empty for no drafts."""
    if isinstance(conf, np.ndarray):
        if conf.ndim != 2:
            raise ValueError(f"conf: expected a [requests, nextn] array, got shape {conf.shape}")
        lengths = np.full(conf.shape[0], conf.shape[1], dtype=np.int32)
        return np.ascontiguousarray(conf, dtype=np.float64), lengths
    rows = [np.asarray([] if c is None else c, dtype=np.float64) for c in conf]
    for i, row in enumerate(rows):
        if row.ndim != 1:
            raise ValueError(f"conf[{i}]: expected a 1-d sequence of probabilities, got shape {row.shape}")
    longest = max((len(r) for r in rows), default=0)
    width = longest if nextn is None else nextn
    if longest > width:
        raise ValueError(f"conf: a request holds {longest} drafts; expected at most nextn = {width}")
    out = np.zeros((len(rows), width), dtype=np.float64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out, np.asarray([len(r) for r in rows], dtype=np.int32)


def plan_verification(
    conf: Confidences,
    curve: ThroughputCurve,
    max_total: int,
    *,
    other_rows: int = 0,
    fixed_ms: float = 0.0,
    draft_ms: float | Sequence[float] = (),
) -> VerifyPlan:
    """Confidence-scheduled plan: T <= max_total drafts and N + other_rows + T <= curve.largest rows;
    `other_rows` (prefill chunks in the same step) cost time and emit nothing counted here; `fixed_ms`
    is added to every candidate's predicted time (not to `step_ms`). `draft_ms`: the draft pass that
    drafting costs per step (one value, or one per draft depth 1, 2, ...), paid only by a plan that
    verifies drafts (`VerifyPlan.draft_ms`), so the plan verifies nothing when no drafting plan beats
    N / curve(N + other_rows)."""
    values, lengths = as_confidences(conf)
    depths = [float(draft_ms)] if isinstance(draft_ms, int | float) else [float(x) for x in draft_ms]
    return _native.plan_verification(values, lengths, curve, max_total, other_rows, fixed_ms, depths)


def plan_rate(plan: VerifyPlan, fixed_ms: float = 0.0) -> float:
    """A plan's expected tokens per ms, its draft pass included (0 for a plan with nothing to run)."""
    total = plan.step_ms + fixed_ms + plan.draft_ms
    return plan.expected_tokens / total if total > 0 else 0.0


def plan_fixed(
    conf: Confidences,
    draft_len: int,
    *,
    max_total: int,
    curve: ThroughputCurve | None = None,
    other_rows: int = 0,
) -> VerifyPlan:
    """Fixed-length mode: each request verifies min(draft_len, its drafts); past max_total (or the
    curve) the last positions are dropped first. The confidences only fill `expected_tokens`."""
    values, lengths = as_confidences(conf)
    return _native.plan_fixed(values, lengths, draft_len, curve, max_total, other_rows)


def split_drafts(conf: Confidences, total: int) -> np.ndarray:
    """Drafts per request when `total` verified drafts go to the largest cumulative probabilities (the
    split of a total fixed earlier, e.g. from older confidences, as DeepInfer's GPU kernel does)."""
    values, lengths = as_confidences(conf)
    return _native.split_drafts(values, lengths, total)


class SpecStats:
    """Verify outcomes accumulated over steps (definitions in `runtime/csrc/spec_stats.h`)."""

    def __init__(self, nextn: int, num_bins: int = 10) -> None:
        self.native = _native.SpecStats(nextn, num_bins)

    def record(
        self, verified: Sequence[int], accepted: Sequence[int], conf: Confidences | None = None
    ) -> None:
        """One step: drafts verified and accepted per request, and the confidences the plan used."""
        v = np.ascontiguousarray(verified, dtype=np.int32).reshape(-1)
        a = np.ascontiguousarray(accepted, dtype=np.int32).reshape(-1)
        c = None if conf is None else as_confidences(conf, self.native.nextn)[0]
        self.native.record(v, a, c)

    def snapshot(self) -> dict[str, object]:
        """Totals and rates as plain Python values (None where a rate has no denominator yet)."""
        return snapshot_dict(self.native.snapshot())

    def reset(self) -> None:
        self.native.reset()


def snapshot_dict(s: SpecStatsSnapshot) -> dict[str, object]:
    def rate(x: float) -> float | None:
        return None if math.isnan(x) else x

    counts = ("steps", "sequences", "verified_tokens", "accepted_tokens", "calibration_count")
    rates = ("accept_rate", "mean_accepted_len", "mean_verified_len", "calibration_mae", "calibration_ece")
    lists = ("verified_at", "reached_at", "accepted_at", "bin_count")
    rate_lists = ("position_accept_rate", "position_conditional_rate", "bin_confidence", "bin_acceptance")
    out: dict[str, object] = {k: int(getattr(s, k)) for k in counts}
    out |= {k: rate(getattr(s, k)) for k in rates}
    out |= {k: [int(x) for x in getattr(s, k)] for k in lists}
    out |= {k: [rate(x) for x in getattr(s, k)] for k in rate_lists}
    return out


@dataclass(frozen=True, slots=True)
class SpecScheduleConfig:
    """How verify steps choose their drafts. "confidence" (the default) plans with the throughput curve;
    "fixed" verifies min(draft_len, drafts held) per request. The correction settings apply to the
    curve a `VerifyScheduler` is given (see `runtime/csrc/spec_curve.h`)."""

    mode: Mode = "confidence"
    nextn: int = 5
    draft_len: int | None = None  # fixed mode; None: nextn
    window: int = 5000
    min_samples: int = 10
    min_fraction: float = 0.1
    num_bins: int = 10

    def __post_init__(self) -> None:
        if self.mode not in ("confidence", "fixed"):
            raise ValueError(f"SpecScheduleConfig.mode = {self.mode!r}; expected 'confidence' or 'fixed'")
        if self.nextn < 1:
            raise ValueError(f"SpecScheduleConfig.nextn = {self.nextn} is not positive")
        if self.draft_len is not None and not 0 <= self.draft_len <= self.nextn:
            raise ValueError(
                f"SpecScheduleConfig.draft_len = {self.draft_len} is outside 0..nextn = {self.nextn}"
            )

    @property
    def fixed_len(self) -> int:
        return self.nextn if self.draft_len is None else self.draft_len


class VerifyScheduler:
    """The engine's one object for verification planning: plans each step in the configured mode,
    corrects the curve from measured step times and accumulates the acceptance statistics."""

    def __init__(self, config: SpecScheduleConfig, curve: ThroughputCurve | None) -> None:
        if config.mode == "confidence" and curve is None:
            raise ValueError("VerifyScheduler: mode 'confidence' needs a throughput curve (profile_curve)")
        self.config = config
        self.curve = None if curve is None else _with_correction(curve, config)
        self.stats = SpecStats(config.nextn, config.num_bins)

    def plan(self, conf: Confidences, max_total: int, *, other_rows: int = 0) -> VerifyPlan:
        """Drafts per request for this step; `max_total` caps the step's verified drafts."""
        values, lengths = as_confidences(conf, self.config.nextn)
        if self.config.mode == "fixed":
            fixed_len = self.config.fixed_len
            return _native.plan_fixed(values, lengths, fixed_len, self.curve, max_total, other_rows)
        return _native.plan_verification(values, lengths, self.curve, max_total, other_rows)

    def observe(self, num_rows: int, step_ms: float) -> None:
        """A measured step of `num_rows` real rows (a no-op without a curve)."""
        if self.curve is not None:
            self.curve.observe(num_rows, step_ms)

    def record(
        self, verified: Sequence[int], accepted: Sequence[int], conf: Confidences | None = None
    ) -> None:
        self.stats.record(verified, accepted, conf)

    def snapshot(self) -> dict[str, object]:
        """Statistics plus the mode and the curve's current correction, for outputs and logs."""
        slope = None if self.curve is None else self.curve.slope_ms
        return {"mode": self.config.mode, "curve_slope_ms": slope, **self.stats.snapshot()}


def _with_correction(curve: ThroughputCurve, config: SpecScheduleConfig) -> ThroughputCurve:
    lookup: Lookup = "step" if curve.lookup == CurveLookup.STEP else "linear"
    return make_curve(
        curve.sizes,
        curve.step_ms,
        lookup=lookup,
        window=config.window,
        min_samples=config.min_samples,
        min_fraction=config.min_fraction,
    )
