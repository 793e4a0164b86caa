"""The configs of the engine's parts, derived from the EngineConfig tree in this one place: the C++
scheduler's (`SchedulerConfig`: limits, prefix cache, replay, engine type, the cache layout of the model
built with the tree's page size and max_model_len, and the verify fields of the resolved drafting) and
the verify planner's (`SpecScheduleConfig`). A part's own tuning constants that no EngineConfig field
sets (the curve correction window, `spec_pause.PauseConfig`) keep their module's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsgraph.models.interface import ratios
from dsgraph.runtime.engine_config import EngineConfig, SpeculativeConfig
from dsgraph.runtime.scheduler import EngineType, SchedulerConfig
from dsgraph.runtime.spec_schedule import SpecScheduleConfig

__all__ = ["scheduler_config", "spec_schedule_config"]


def scheduler_config(
    config: EngineConfig, model: Any, sizes: Any, verify: Mapping[str, object]
) -> SchedulerConfig:
    """The scheduler over the session's pages and slots (`sizes`: its CacheSizes) for `model` (whose
    geometry carries the tree's page size and max_model_len); `verify`: `SpecSetup.scheduler_fields()`."""
    return SchedulerConfig.for_model(
        model,
        num_pages=[sizes.num_pages[r] for r in ratios(model.plans)],
        replay=config.cache.prefix_replay,
        max_num_seqs=config.scheduler.max_num_seqs,
        num_slots=sizes.num_slots,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        enable_prefix_cache=config.cache.enable_prefix_cache,
        engine_type=getattr(EngineType, config.engine_type.upper()),
        **verify,
    )


def spec_schedule_config(spec: SpeculativeConfig, nextn: int, draft_len: int) -> SpecScheduleConfig:
    """The verify planner's mode and lengths (`nextn`: the checkpoint's drafts per request, capped by
    the rollback room; `draft_len`: the fixed schedule's, resolved against it)."""
    return SpecScheduleConfig(mode=spec.verify_schedule, nextn=nextn, draft_len=draft_len)  # type: ignore[arg-type]
