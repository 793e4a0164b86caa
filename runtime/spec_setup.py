"""How an engine's speculative decoding is set up from `EngineConfig.speculative` (validated there): the
choice of "auto", the scheduler's verify fields, and the throughput curve (given explicitly, or profiled
on the session at start and cached on disk under $XDG_CACHE_HOME/dsgraph/curves, keyed by the model
config, the buckets and the device; runtime/spec_schedule.py)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from dsgraph.models.registry import family_of
from dsgraph.platform import env
from dsgraph.runtime.derived_configs import spec_schedule_config
from dsgraph.runtime.engine_config import MAX_DRAFT_LEN, SpeculativeConfig
from dsgraph.runtime.scheduler import default_buckets
from dsgraph.runtime.spec_engine import SpecDecoder
from dsgraph.runtime.spec_pause import DraftCost, DraftCosts, DraftPause
from dsgraph.runtime.spec_schedule import (
    ThroughputCurve,
    VerifyScheduler,
    load_or_profile_curve,
    make_curve,
    wall_clock,
)

__all__ = [
    "SpecSetup",
    "curve_cache_dir",
    "profile_drafter",
    "profile_session",
    "setup_spec",
]


@dataclass(frozen=True)
class SpecSetup:
    enabled: bool
    nextn: int
    config: SpeculativeConfig

    @classmethod
    def resolve(
        cls, config: SpeculativeConfig, cfg: Any, weights: Mapping[str, torch.Tensor], *, platform: str
    ) -> SpecSetup:
        """Whether to draft: with the family's method ("dspark" for V4.1, "mtp" for V4) always (its draft
        layers must exist), "auto" when the checkpoint has them and the platform is cuda, "off" never. The
        mode is one of SPECULATIVE already (SpeculativeConfig); whether it fits this model needs the model."""
        family = family_of(cfg)
        drafting, asked = family.drafting, config.mode
        path = f"EngineConfig.speculative.mode = {asked!r}"
        if asked not in ("auto", "off", drafting.method):
            raise ValueError(
                f"{path}: not available for {family.model_type} checkpoints, which draft with "
                f"{drafting.method!r} (allowed: 'auto', {drafting.method!r}, 'off')"
            )
        missing = drafting.missing(cfg, weights)
        if asked == drafting.method and missing is not None:
            raise ValueError(f"{path} needs the checkpoint's draft layers: {missing}")
        enabled = asked == drafting.method or (asked == "auto" and missing is None and platform == "cuda")
        return cls(enabled, min(drafting.num_tokens(cfg), MAX_DRAFT_LEN) if enabled else 0, config)

    @property
    def draft_len(self) -> int:
        """Fixed schedule: drafts verified per request (all of them by default)."""
        return self.nextn if self.config.draft_len is None else min(self.config.draft_len, self.nextn)

    def scheduler_fields(self) -> dict[str, object]:
        if not self.enabled:
            return {}
        return {"verify_mode": self.config.verify_schedule, "nextn": self.nextn, "draft_len": self.draft_len}


def curve_cache_dir() -> Path:
    return env.cache_home() / "dsgraph" / "curves"


def profile_inputs(model: Any, n: int) -> dict[str, np.ndarray]:
    """A step of n real rows: sequences of consecutive positions from 0 in slots 0, 1, ..., on pages
    0, 1, ... (the caches are cleared after profiling)."""
    from dsgraph.runtime.step_builder import packed_inputs

    span = model.geo.max_model_len - 1
    return packed_inputs(model, [min(span, n - i) for i in range(0, n, span)], n)


def profile_session(session: Any, buckets: list[int], *, repeats: int = 5) -> ThroughputCurve:
    """Tokens per step vs step time over `buckets` on the session (cached on disk), caches cleared after.
    On a terminal a progress bar counts the buckets run (each captured on its first run)."""
    bar = tqdm(total=len(buckets), desc="capture and profile", unit="bucket", disable=not sys.stderr.isatty())
    seen: set[int] = set()

    def run(n: int) -> None:
        session.run(profile_inputs(session.model, n))
        session.runner.synchronize()
        if n not in seen:
            seen.add(n)
            bar.update(1)

    device = session.runner.device_name()
    model = session.model
    key_config = repr((model.cfg, model.geo, model.num, session.cache_sizes.sizes()))
    curve = load_or_profile_curve(
        wall_clock(run),
        buckets,
        cache_dir=curve_cache_dir(),
        model_config=key_config,
        device_name=device,
        repeats=repeats,
        lookup="step" if session.runner.pads else "linear",
    )
    bar.close()
    for t in session.caches.values():
        t.zero_()
    return curve


def profile_drafter(
    session: Any, decoder: SpecDecoder, max_num_seqs: int, *, greedy: bool = False, repeats: int = 5
) -> dict[int, float]:
    """Draft pass ms per bucket of sequences (powers of two up to max_num_seqs) of the greedy variant or
    the full graph (sampled requests), cached on disk beside the throughput curve (in its `draft/`
    folder); the passes draft from position 0 of slots 0.. (the rings are cleared after)."""
    buckets = [1 << i for i in range(max(max_num_seqs - 1, 0).bit_length() + 1)]

    def run(n: int) -> None:  # tokens synchronise
        decoder.drafter.run(decoder.drafter.probe_requests(n, greedy))

    device = session.runner.device_name()
    model = session.model
    variant = "greedy variant" if greedy else "full graph"
    key_config = repr(("draft pass", variant, model.cfg, model.geo, model.num, session.cache_sizes.sizes()))
    cost = load_or_profile_curve(
        wall_clock(run),
        buckets,
        cache_dir=curve_cache_dir() / "draft",
        model_config=key_config,
        device_name=device,
        repeats=repeats,
    )
    for name in decoder.drafter.cache_names:
        session.caches[name].zero_()
    return dict(zip(cost.sizes, cost.step_ms, strict=True))


def given_cost(pairs: Any) -> DraftCost | None:
    return None if pairs is None else DraftCost(dict(zip(*pairs, strict=True)), fixed=True)


def profiled_costs(session: Any, decoder: SpecDecoder, max_num_seqs: int) -> DraftCosts:
    """The full graph's pass, and the greedy variant's where the drafter has it."""
    full = DraftCost(profile_drafter(session, decoder, max_num_seqs))
    if not decoder.drafter.greedy_enabled:
        return DraftCosts(full)
    return DraftCosts(full, DraftCost(profile_drafter(session, decoder, max_num_seqs, greedy=True)))


def setup_spec(
    spec: SpecSetup, engine: Any, weights: Mapping[str, torch.Tensor]
) -> tuple[SpecDecoder, ThroughputCurve | None]:
    """The engine's decoder and the curve shared with its scheduler (None in fixed mode)."""
    c, limits = spec.config, engine.config.scheduler
    curve = None
    if c.throughput_curve is not None:
        curve = make_curve(*c.throughput_curve, lookup="step" if engine.session.runner.pads else "linear")
    elif c.verify_schedule == "confidence":
        curve = profile_session(engine.session, list(default_buckets(limits.max_num_batched_tokens)))
    sched = VerifyScheduler(spec_schedule_config(c, spec.nextn, spec.draft_len), curve)
    decoder = SpecDecoder(
        engine.session, weights, engine.sampler, sched, nextn=spec.nextn, deterministic=c.deterministic
    )
    if c.draft_cost is not None:  # given; without draft_cost_greedy one table prices both variants
        decoder.cost = DraftCosts(given_cost(c.draft_cost), given_cost(c.draft_cost_greedy))
    elif c.throughput_curve is None and curve is not None:  # profiled with the curve, cached beside it
        decoder.cost = profiled_costs(engine.session, decoder, limits.max_num_seqs)
    elif c.throughput_curve is not None:
        # a given curve has its own time scale: passes timed on this host are not in it, so without a
        # given draft_cost the planner takes the pass as free (as before any pass is measured)
        decoder.cost = DraftCosts(DraftCost(fixed=True))
    if c.draft_pause and sched.curve is not None:
        decoder.pause = DraftPause(sched.curve, decoder.cost, spec.nextn)
    return decoder, sched.curve
