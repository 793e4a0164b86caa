"""dsgraph.runtime: sessions, the C++ runtime (`dsgraph.runtime._native`) and the user APIs.

`Session` (one model's weights, caches and lowered programs; `Session.from_checkpoint(dir, config)`) and
its step builder are loaded on first use, as are `EngineConfig` and its sub-configs. `_native` is not
imported here, so pure-Python parts of the runtime stay importable (and their import errors readable)
even where the extension has not been built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsgraph._lazy import lazy_names

if TYPE_CHECKING:
    from dsgraph.runtime.engine_config import (
        CacheConfig,
        CudaConfig,
        EngineConfig,
        LoadConfig,
        SchedulingConfig,
        SpeculativeConfig,
        TruncationConfig,
    )
    from dsgraph.runtime.session import CacheSizes, Session
    from dsgraph.runtime.step_builder import CachePoolError, SeqState, Step, StepBuilder

__all__ = [
    "CacheConfig",
    "CachePoolError",
    "CacheSizes",
    "CudaConfig",
    "EngineConfig",
    "LoadConfig",
    "SchedulingConfig",
    "SeqState",
    "Session",
    "SpeculativeConfig",
    "Step",
    "StepBuilder",
    "TruncationConfig",
]

_WHERE = {
    "CachePoolError": "dsgraph.runtime.step_builder",
    "CacheSizes": "dsgraph.runtime.session",
    "CacheConfig": "dsgraph.runtime.engine_config",
    "CudaConfig": "dsgraph.runtime.engine_config",
    "EngineConfig": "dsgraph.runtime.engine_config",
    "LoadConfig": "dsgraph.runtime.engine_config",
    "SchedulingConfig": "dsgraph.runtime.engine_config",
    "SpeculativeConfig": "dsgraph.runtime.engine_config",
    "TruncationConfig": "dsgraph.runtime.engine_config",
    "SeqState": "dsgraph.runtime.step_builder",
    "Session": "dsgraph.runtime.session",
    "Step": "dsgraph.runtime.step_builder",
    "StepBuilder": "dsgraph.runtime.step_builder",
}


__getattr__, __dir__ = lazy_names("dsgraph.runtime", _WHERE)
