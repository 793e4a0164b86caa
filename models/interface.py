"""What the runtime may use of any model: the step layout both DeepSeek models share (cache geometry, the
compressed caches' ratios, rollback room), the numerics modes, the checkpoint tensor format (specs,
dtypes, random init and quantization of stored tensors), the drafting request both drafters take, the
prefill truncation modes, and the model protocol. The runtime imports these names from here and the
per-model parts from `models/registry.py`, never a model package (`tests/unit/test_runtime_imports.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dsgraph.graph import Graph, TensorType
from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, TensorSpec, scale_name
from dsgraph.models.deepseek_v41.dspark import DRAFT_STREAM
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest
from dsgraph.models.deepseek_v41.engram_map import tokenizer_path
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING, Numerics, numerics_for
from dsgraph.models.deepseek_v41.step_io import ROLLBACK_ROOM, CacheGeometry, default_geometry, ratios
from dsgraph.models.deepseek_v41.tiny import quantize_tensor, sample_weight
from dsgraph.models.deepseek_v41.truncation import MODES as TRUNCATION_MODES
from dsgraph.models.deepseek_v41.weights import weight_types

__all__ = [
    "DRAFT_STREAM",
    "REFERENCE",
    "ROLLBACK_ROOM",
    "SERVING",
    "TRUNCATION_MODES",
    "CacheGeometry",
    "DraftRequest",
    "Drafter",
    "Model",
    "Numerics",
    "TensorKind",
    "TensorSpec",
    "default_geometry",
    "numerics_for",
    "quantize_tensor",
    "ratios",
    "sample_weight",
    "scale_name",
    "tokenizer_path",
    "torch_dtype",
    "weight_types",
]


class Model(Protocol):
    """A traceable model: what Session, the scheduler and the engine read of V4.1 and V4 alike."""

    cfg: Any  # `.text` holds vocab_size, sliding_window, num_hidden_layers, max_position_embeddings, ...
    plans: tuple[Any, ...]  # per layer; `.ratio` > 0 for layers with compressed caches
    geo: CacheGeometry
    dspark: bool  # built to draft (the step also writes what the drafter reads)
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


class Drafter(Protocol):
    """What `runtime/spec_draft.py` reads of a model built with `dspark=True` (to draft: V4.1 with its
    DSpark stages, V4 with its MTP layer): which checkpoint weights the draft graph and the target step's
    context part read, the draft graph (outputs `draft_tokens` [seqs, K], `draft_logprobs` [seqs, K, V],
    `confidence` [seqs, K]; its `caches.*` inputs are caches of the model that the target step writes),
    its step inputs, and K, the tokens one pass drafts. `trace_draft(..., greedy=True)`: the variant for
    passes whose requests are all greedy, with the same tokens and confidences and no `draft_logprobs`."""

    @property
    def num_draft_tokens(self) -> int: ...

    def is_draft_weight(self, name: str) -> bool: ...

    def is_context_weight(self, name: str) -> bool: ...

    def trace_draft(
        self, weights: Mapping[str, TensorType], *, stream: int = ..., greedy: bool = ...
    ) -> Graph: ...

    def draft_inputs(self, requests: Sequence[DraftRequest], num_seqs: int) -> dict[str, Any]: ...
