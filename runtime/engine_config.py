"""EngineConfig: everything that shapes an engine, one frozen tree of typed sub-configs, each validated in
its own `__post_init__` (a ValueError names the field's path, the value and what is allowed:
`EngineConfig.speculative.draft_len = -1: expected None or an integer in 0..5`).

The user surface is flat: `LLM(model, max_num_seqs=4, speculative="off")` keyword arguments and the CLI
flags (tools/engine_args.py, which takes its defaults and allowed values from here) are option names
that `EngineConfig.from_flat` maps onto the tree through `FLAT` (one row per option: its sub-config and
field); `flat()` maps back (bundle manifests, the rank processes of expert parallelism). The configs of
the parts (the scheduler's, the verify planner's) are derived from the tree in runtime/derived_configs.py;
each part is handed only the sub-config it needs (the session `cuda`, drafting `speculative`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from dsgraph.models.interface import ROLLBACK_ROOM, TRUNCATION_MODES
from dsgraph.models.registry import FAMILIES

__all__ = [
    "FLAT",
    "CacheConfig",
    "ConfigError",
    "CudaConfig",
    "EngineConfig",
    "LoadConfig",
    "SchedulingConfig",
    "SpeculativeConfig",
    "TruncationConfig",
    "check_draft_cost",
]

PLATFORMS = ("cpu", "cuda")
NUMERICS = ("serving", "reference")
ENGINE_TYPES = ("normal", "prompt", "completion")
OVERLAP = ("auto", "on", "off")
PREFIX_REPLAY = ("exact", "window")
LOAD_FORMATS = ("auto", "dummy")
# each drafting mode names one family's draft layers (models/registry.py `Drafting.method`); which one a
# checkpoint accepts is checked when it is loaded (runtime/spec_setup.py `SpecSetup.resolve`)
SPECULATIVE = ("auto", *sorted({f.drafting.method for f in FAMILIES.values()}), "off")
VERIFY_SCHEDULES = ("confidence", "fixed")
# verify rows write a..a+nextn and the rings roll back ROLLBACK_ROOM entries
MAX_DRAFT_LEN = ROLLBACK_ROOM - 1
# the largest bucket (query tokens) captured by default; beyond it steps run eagerly (CudaConfig)
CAPTURE_MAX_TOKENS = 16384

Pairs = tuple[tuple[int, ...], tuple[Any, ...]]


class ConfigError(ValueError):
    """A bad config value: `path` (EngineConfig.<sub>.<field>), the value and what is allowed."""

    def __init__(self, path: str, value: object, expected: str, option: str | None = None) -> None:
        self.path, self.value, self.expected, self.option = path, value, expected, option
        named = f" (option {option})" if option and not path.endswith(f".{option}") else ""
        super().__init__(f"{path} = {value!r}{named}: expected {expected}")


def _one_of(path: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(path, value, "one of " + ", ".join(repr(a) for a in allowed))


def _int(path: str, value: object, low: int, high: int | None = None, *, none: bool = False) -> None:
    if value is None and none:
        return
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):  # type: ignore[operator]
        span = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigError(path, value, f"{'None or ' if none else ''}an integer {span}")


def _bool(path: str, value: object, *, none: bool = False) -> None:
    if not isinstance(value, bool) and not (none and value is None):
        raise ConfigError(path, value, "None or a bool" if none else "a bool")


def _is_pairs(x: object) -> bool:
    """Whether `x` is (sizes, values) of equal, non-zero length."""
    return isinstance(x, tuple | list) and len(x) == 2 and len(x[0]) == len(x[1]) and bool(x[0])


def check_draft_cost(cost: object, path: str = "EngineConfig.speculative.draft_cost") -> None:
    """ConfigError unless `cost` is (seq counts, ms) of equal, non-zero length; an ms entry is one time,
    or a non-empty sequence of times by draft depth (1, 2, ...)."""
    if not _is_pairs(cost):
        raise ConfigError(path, cost, "(sequence counts, draft ms) of equal, non-zero length")
    for n, ms in zip(*cost, strict=True):  # type: ignore[misc]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(path, cost, f"sequence counts >= 1 (got {n!r})")
        times = ms if isinstance(ms, tuple | list) else (ms,)
        bad = [t for t in times if not isinstance(t, int | float) or not math.isfinite(t) or t < 0]
        if not times or bad:
            raise ConfigError(
                path, cost, f"finite draft ms >= 0, one or one per draft depth (got {ms!r} for {n} sequences)"
            )


def _check_curve(path: str, curve: object) -> None:
    if not _is_pairs(curve):
        raise ConfigError(path, curve, "(row counts, step ms) of equal, non-zero length")
    # the native curve states its own rule; imported only here, so building a config needs no extension
    from dsgraph.runtime.spec_schedule import make_curve

    try:
        make_curve(curve[0], curve[1])
    except (ValueError, TypeError) as exc:
        raise ConfigError(path, curve, f"a valid throughput curve ({exc})") from None


@dataclass(frozen=True)
class SchedulingConfig:
    """EngineConfig.scheduler: the step limits, and zero-overhead scheduling (runtime/engine_overlap.py:
    the host commits step N, detokenizes and plans N+2 while the device runs N+1). overlap "auto": on for
    platform cuda (NORMAL and PROMPT engines), off on cpu; "on" / "off". COMPLETION engines and steps with
    prompt logprobs or teacher-forced tokens run without overlap."""

    max_num_seqs: int = 8  # also the state slots of the caches
    max_num_batched_tokens: int = 256  # tokens per step (the prefill chunk)
    overlap: str = "auto"

    def __post_init__(self) -> None:
        _int("EngineConfig.scheduler.max_num_seqs", self.max_num_seqs, 1)
        _int("EngineConfig.scheduler.max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _one_of("EngineConfig.scheduler.overlap", self.overlap, OVERLAP)


@dataclass(frozen=True)
class CacheConfig:
    """EngineConfig.cache: paged compressed caches and the prefix cache.

    budget_bytes None: pages for max_num_seqs requests of max_model_len. The prefix cache keeps the global
    (compressed) caches of earlier prompts and recomputes the last tokens of a hit to rebuild SWA state,
    which is never cached (spec 5.6 item 1). prefix_replay "exact" replays window * layers tokens: bit for
    bit the tokens of a cold run, at the price of recomputing that many tokens per hit. "window" (an
    explicit approximation) replays one window: attention reads no SWA key below the replay start, so the
    rebuilt SWA state only approximates a cold prefill (global caches stay exact; the error is bounded to
    the replayed window and deterministic; tests/e2e/test_llm.py states the bound); greedy tokens may
    change."""

    page_size: int = 16
    budget_bytes: int | None = None
    enable_prefix_cache: bool = True
    prefix_replay: str = "exact"

    def __post_init__(self) -> None:
        _int("EngineConfig.cache.page_size", self.page_size, 1)
        _int("EngineConfig.cache.budget_bytes", self.budget_bytes, 1, none=True)
        _bool("EngineConfig.cache.enable_prefix_cache", self.enable_prefix_cache)
        _one_of("EngineConfig.cache.prefix_replay", self.prefix_replay, PREFIX_REPLAY)


@dataclass(frozen=True)
class SpeculativeConfig:
    """EngineConfig.speculative: speculative decoding with the checkpoint's own draft layers
    (runtime/spec_engine.py).

    mode "dspark" (V4.1's DSpark stages) or "mtp" (V4's MTP layer, vLLM's method name): on, and loading
    fails naming what is missing when the checkpoint has no such layers; a method of another family is an
    error at load. "auto": on when the checkpoint has them and the platform is cuda (the cpu default stays
    fast); "off". verify_schedule "confidence" plans each step's verified drafts from the
    confidence head and the throughput curve; "fixed" verifies draft_len (None: all) drafts per request.
    deterministic: every emitted token is the target's own seeded sample, so tokens do not depend on the
    batch or on how many drafts were verified. throughput_curve: (row counts, step ms) given explicitly;
    None profiles the session at start (cached under $XDG_CACHE_HOME/dsgraph/curves, corrected online).
    draft_pause: skip the draft pass while the realised acceptance does not pay for it, re-probing with
    exponential backoff (runtime/spec_pause.py; needs a curve). draft_cost: (sequence counts, draft pass
    ms, one time or one per draft depth) used as given; None profiles the pass with the curve (when the
    curve is profiled), or takes it as free beside a given throughput_curve. draft_cost_greedy: the same
    for the drafter's greedy variant (passes whose requests are all greedy, several times cheaper than
    the full graph's sorted sampling); None with a given draft_cost: draft_cost prices both."""

    mode: str = "auto"
    verify_schedule: str = "confidence"
    draft_len: int | None = None
    deterministic: bool = False
    throughput_curve: Pairs | None = None
    draft_pause: bool = True
    draft_cost: Pairs | None = None
    draft_cost_greedy: Pairs | None = None

    def __post_init__(self) -> None:
        p = "EngineConfig.speculative"
        _one_of(f"{p}.mode", self.mode, SPECULATIVE)
        _one_of(f"{p}.verify_schedule", self.verify_schedule, VERIFY_SCHEDULES)
        _int(f"{p}.draft_len", self.draft_len, 0, MAX_DRAFT_LEN, none=True)
        _bool(f"{p}.deterministic", self.deterministic)
        _bool(f"{p}.draft_pause", self.draft_pause)
        if self.throughput_curve is not None:
            _check_curve(f"{p}.throughput_curve", self.throughput_curve)
        for name in ("draft_cost", "draft_cost_greedy"):
            if getattr(self, name) is not None:
                check_draft_cost(getattr(self, name), f"{p}.{name}")
        if self.draft_cost_greedy is not None and self.draft_cost is None:
            raise ValueError(f"{p}.draft_cost_greedy is given without draft_cost (the full graph's pass)")


@dataclass(frozen=True)
class TruncationConfig:
    """EngineConfig.truncation: prefill truncation (decoder-side SWA bounded replay;
    runtime/prefill_truncation.py). mode "off" (default, exact), or "mask" / "compact", an explicit
    approximation: the decoder layers run only on each prompt's last keep_tokens tokens (None: the
    minimum, sliding_window + maximum backtrack = 134 for V4.1), so their window state only approximates
    a full prefill; global caches stay exact. compact gathers the kept rows (the speed-up), mask narrows
    attention (same values, a reference). Requests with prompt logprobs or golden_token_ids run
    untruncated. The rule against the model (keep_tokens >= the minimum) is checked when it is loaded."""

    mode: str = "off"
    keep_tokens: int | None = None

    def __post_init__(self) -> None:
        _one_of("EngineConfig.truncation.mode", self.mode, TRUNCATION_MODES)
        _int("EngineConfig.truncation.keep_tokens", self.keep_tokens, 1, none=True)


@dataclass(frozen=True)
class LoadConfig:
    """EngineConfig.load: format "auto": weights from the checkpoint's safetensors; "dummy": random
    weights of the config's shapes, generated on the platform's device (benchmarks; the text is noise).
    check_weights: check every weight is finite at load (the error names the first NaN/inf tensor);
    None: only for checkpoints up to checkpoint_io.FINITE_CHECK_BYTES."""

    format: str = "auto"
    check_weights: bool | None = None

    def __post_init__(self) -> None:
        _one_of("EngineConfig.load.format", self.format, LOAD_FORMATS)
        _bool("EngineConfig.load.check_weights", self.check_weights, none=True)


@dataclass(frozen=True)
class CudaConfig:
    """EngineConfig.cuda: how the cuda platform runs the session's buckets (unused on cpu).

    capture: record each bucket's program into CUDA graphs once and replay it (False: run eagerly on the
    same padded shapes, for debugging). Buckets of more than capture_max_tokens tokens (long prefill
    chunks) always run eagerly: a captured graph keeps its activations' memory for the session's life, and
    at that size the per-kernel launch cost is a vanishing part of the step. engram_host_min_bytes: Engram
    tables of at least this many bytes stay in pinned host memory (None: $DSGRAPH_ENGRAM_HOST_MIN_BYTES,
    1 GiB). side_stream: gather host-resident Engram rows on a side stream that overlaps the first layers
    (None: $DSGRAPH_SIDE_STREAM, on). Neither of the last two changes a result, only where and when."""

    capture: bool = True
    capture_max_tokens: int = CAPTURE_MAX_TOKENS
    engram_host_min_bytes: int | None = None
    side_stream: bool | None = None

    def __post_init__(self) -> None:
        _bool("EngineConfig.cuda.capture", self.capture)
        _int("EngineConfig.cuda.capture_max_tokens", self.capture_max_tokens, 1)
        _int("EngineConfig.cuda.engram_host_min_bytes", self.engram_host_min_bytes, 0, none=True)
        _bool("EngineConfig.cuda.side_stream", self.side_stream, none=True)


# read-only tables (MappingProxyType): nothing can re-map an option at run time
SUBCONFIGS: Mapping[str, type] = MappingProxyType(
    {
        "scheduler": SchedulingConfig,
        "cache": CacheConfig,
        "speculative": SpeculativeConfig,
        "truncation": TruncationConfig,
        "load": LoadConfig,
        "cuda": CudaConfig,
    }
)


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes an engine. platform "cpu": the executable specification; "cuda": weights and
    caches on the GPU, Triton kernels, one CUDA graph per bucket (platform/cuda), sampling on the device.
    engine_type (prefill/decode disaggregation, runtime/kvstore/pd_engines.py): "normal" prefills and
    decodes; "prompt" prefills, hands the caches off and stops at the first token; "completion" admits
    handed-off requests and decodes; drafting runs on normal engines only, overlap on normal and prompt
    ones. bundle: an ahead-of-time bundle (`dsgraph compile`, docs/bundle.md) whose graphs, programs,
    kernels and tuned tables replace tracing, lowering, compiling and profiling; one that does not fit
    this machine or these options is refused with every mismatch listed."""

    platform: str = "cpu"
    numerics: str = "serving"
    max_model_len: int = 1024
    engine_type: str = "normal"
    bundle: str | None = None
    scheduler: SchedulingConfig = field(default_factory=SchedulingConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    truncation: TruncationConfig = field(default_factory=TruncationConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    cuda: CudaConfig = field(default_factory=CudaConfig)

    def __post_init__(self) -> None:
        _one_of("EngineConfig.platform", self.platform, PLATFORMS)
        _one_of("EngineConfig.numerics", self.numerics, NUMERICS)
        _int("EngineConfig.max_model_len", self.max_model_len, 1)
        _one_of("EngineConfig.engine_type", self.engine_type, ENGINE_TYPES)
        if self.bundle is not None and not isinstance(self.bundle, str):
            raise ConfigError("EngineConfig.bundle", self.bundle, "None or a path (str)")
        for name, kind in SUBCONFIGS.items():
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"EngineConfig.{name}", getattr(self, name), f"a {kind.__name__}")
        overlap, mode = self.scheduler.overlap, self.speculative.mode
        if self.engine_type != "normal" and (
            mode not in ("auto", "off") or (self.engine_type, overlap) == ("completion", "on")
        ):
            raise ConfigError(
                "EngineConfig.engine_type",
                self.engine_type,
                "'normal' with a drafting speculative.mode (and with scheduler.overlap 'on' on a completion "
                f"engine); got scheduler.overlap={overlap!r}, speculative.mode={mode!r}",
            )

    @classmethod
    def from_flat(cls, **options: Any) -> EngineConfig:
        """The tree from flat option names (`LLM` keyword arguments, the CLI's flags; `FLAT` maps each to
        its sub-config field); unset options keep their defaults. An unknown name is a TypeError; a bad
        value a ConfigError naming the path and the option."""
        unknown = sorted(set(options) - set(FLAT))
        if unknown:
            raise TypeError(f"EngineConfig: unknown options {unknown}; known: {sorted(FLAT)}")
        top: dict[str, Any] = {}
        subs: dict[str, dict[str, Any]] = {name: {} for name in SUBCONFIGS}
        for option, value in options.items():
            sub, name = FLAT[option]
            (top if sub is None else subs[sub])[name] = value
        try:
            built = {name: kind(**subs[name]) for name, kind in SUBCONFIGS.items()}
            return cls(**top, **built)
        except ConfigError as exc:
            raise ConfigError(exc.path, exc.value, exc.expected, _option_of(exc.path)) from None

    def flat(self) -> dict[str, Any]:
        """Every option by its flat name (the inverse of `from_flat`; bundle manifests record these)."""
        out = {}
        for option, (sub, name) in FLAT.items():
            out[option] = getattr(self if sub is None else getattr(self, sub), name)
        return out

    def with_flat(self, **options: Any) -> EngineConfig:
        """This config with `options` (flat names) changed."""
        return EngineConfig.from_flat(**{**self.flat(), **options})


def _flat_table() -> dict[str, tuple[str | None, str]]:
    """option -> (sub-config or None for a top-level field, field). A sub-config field is its own option
    name unless RENAMED gives the historical flag name."""
    renamed = {
        ("cache", "budget_bytes"): "cache_budget_bytes",
        ("speculative", "mode"): "speculative",
        ("truncation", "mode"): "prefill_truncation",
        ("truncation", "keep_tokens"): "prefill_keep_tokens",
        ("load", "format"): "load_format",
    }
    table: dict[str, tuple[str | None, str]] = {
        f.name: (None, f.name) for f in fields(EngineConfig) if f.name not in SUBCONFIGS
    }
    for sub, kind in SUBCONFIGS.items():
        for f in fields(kind):
            table[renamed.get((sub, f.name), f.name)] = (sub, f.name)
    return table


FLAT: Mapping[str, tuple[str | None, str]] = MappingProxyType(_flat_table())


def _option_of(path: str) -> str | None:
    parts = tuple(path.split(".")[1:])
    key = (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return next((o for o, where in FLAT.items() if where == key), None)
