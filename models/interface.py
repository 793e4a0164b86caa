"""What the runtime may use of any model: the step layout both DeepSeek models share (cache geometry, the
compressed caches' ratios, rollback room), the numerics modes, and the model protocol. The runtime
imports these names from here and the per-model parts from `models/registry.py`, never a model package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dsgraph.graph import Graph, TensorType
from dsgraph.models.deepseek_v41.engram_map import tokenizer_path
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING, Numerics, numerics_for
from dsgraph.models.deepseek_v41.step_io import ROLLBACK_ROOM, CacheGeometry, default_geometry, ratios
from dsgraph.models.deepseek_v41.weights import weight_types

__all__ = [
    "REFERENCE",
    "ROLLBACK_ROOM",
    "SERVING",
    "CacheGeometry",
    "Model",
    "Numerics",
    "default_geometry",
    "numerics_for",
    "ratios",
    "tokenizer_path",
    "weight_types",
]


class Model(Protocol):
    """A traceable model: what Session, the scheduler and the engine read of V4.1 and V4 alike."""

    cfg: Any  # `.text` holds vocab_size, sliding_window, num_hidden_layers, max_position_embeddings, ...
    plans: tuple[Any, ...]  # per layer; `.ratio` > 0 for layers with compressed caches
    geo: CacheGeometry
    dspark: bool
    expert_parallel: bool
    truncation: str  # prefill truncation mode: "off", "mask" or "compact" (runtime/prefill_truncation.py)

    def step_types(self, truncated: bool = False) -> dict[str, TensorType]: ...

    def cache_types(self) -> dict[str, TensorType]: ...

    def trace_step(
        self,
        weights: Mapping[str, TensorType],
        *,
        name: str = ...,
        debug: bool = ...,
        truncated: bool = ...,
    ) -> Graph: ...
