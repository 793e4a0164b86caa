"""A V4.1 model ready to trace: config, layer roles, Engram constants, numerics and cache geometry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.models.deepseek_v41.backbone import forward
from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.context import Forward
from dsgraph.models.deepseek_v41.dspark_context import ring_types
from dsgraph.models.deepseek_v41.engram_hash import EngramLayerHash, EngramSpec, engram_primes
from dsgraph.models.deepseek_v41.layers_plan import LayerPlan, layer_plans
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.models.deepseek_v41.step_io import CacheGeometry, cache_types, step_types
from dsgraph.models.deepseek_v41.truncation import check_truncatable, truncation_types


@dataclass(frozen=True)
class V41Model:
    cfg: ModelConfig
    plans: tuple[LayerPlan, ...]
    tables: dict[int, EngramLayerHash]  # layer index -> hash constants
    num: Numerics
    geo: CacheGeometry
    engram_pad_id: int
    # The step also writes the DSpark context rings `dspark.ring{s}` (reads `mtp.*` context weights).
    dspark: bool = False
    # The MoEs' experts run on an expert-parallel group (runtime/distributed): dispatch/combine exchange rows.
    expert_parallel: bool = False
    # Prefill truncation ("off", "mask", "compact"; models/deepseek_v41/truncation.py): the variant of
    # the truncated step graph. Steps that truncate no row run the plain graph whatever the mode.
    truncation: str = "off"

    def __post_init__(self) -> None:
        if self.truncation != "off":
            targets = self.cfg.text.dspark_target_layer_ids if self.dspark else ()
            truncation_types(self.truncation)  # names a bad mode
            check_truncatable(self.cfg.text, tuple(targets))

    def step_types(self, truncated: bool = False) -> dict[str, TensorType]:
        """`truncated`: the inputs of a truncated prefill step (the model's `truncation` variant)."""
        types = step_types(self.cfg.text, self.plans, self.geo)
        if truncated:
            types.update(truncation_types(self.truncation))
        return types

    def cache_types(self) -> dict[str, TensorType]:
        types = cache_types(self.cfg.text, self.plans, self.geo)
        if self.dspark:
            types.update(ring_types(self.cfg.text, self.geo.ring_len))
        return types

    def trace_step(
        self,
        weights: Mapping[str, TensorType],
        *,
        name: str = "v41_step",
        debug: bool = False,
        truncated: bool = False,
    ) -> Graph:
        """The step graph (the model interface the runtime calls; `trace_step` below)."""
        return trace_step(self, weights, name=name, debug=debug, truncated=truncated)

    # The drafter interface (`models/interface.py` Drafter) the runtime's DSpark runner calls.
    @property
    def num_draft_tokens(self) -> int:
        return self.cfg.text.dspark_block_size

    def is_draft_weight(self, name: str) -> bool:
        from dsgraph.models.deepseek_v41.dspark_context import is_draft_weight

        return is_draft_weight(name)

    def is_context_weight(self, name: str) -> bool:
        from dsgraph.models.deepseek_v41.dspark_context import is_context_weight

        return is_context_weight(name)

    def trace_draft(
        self, weights: Mapping[str, TensorType], *, stream: int = 3, greedy: bool = False
    ) -> Graph:
        from dsgraph.models.deepseek_v41.dspark import trace_draft

        return trace_draft(self, weights, stream=stream, greedy=greedy)

    def draft_inputs(self, requests: Sequence[Any], num_seqs: int) -> dict[str, Any]:
        from dsgraph.models.deepseek_v41.dspark_io import draft_inputs

        return draft_inputs(self.cfg.text, requests, num_seqs)


def build_model(
    cfg: ModelConfig,
    token_map: list[int],
    num: Numerics,
    geo: CacheGeometry,
    *,
    dspark: bool = False,
    truncation: str = "off",
) -> V41Model:
    """`dspark`: the step graph also writes the DSpark context (needs the config's draft stages).
    `truncation`: the variant of the truncated prefill step ("off", "mask", "compact")."""
    if dspark and cfg.text.num_nextn_predict_layers == 0:
        raise ValueError("build_model: dspark=True needs num_nextn_predict_layers > 0, the config has 0")
    tables = (
        {h.layer_id: h for h in engram_primes(EngramSpec.from_text_config(cfg.text))}
        if cfg.text.engram_layer_ids
        else {}
    )
    pad = token_map[cfg.text.engram_pad_token_id]
    return V41Model(cfg, layer_plans(cfg.text), tables, num, geo, pad, dspark, truncation=truncation)


def trace_step(
    model: V41Model,
    weights: Mapping[str, TensorType],
    *,
    name: str = "v41_step",
    debug: bool = False,
    truncated: bool = False,
) -> Graph:
    """The step graph: inputs `weights.*`, `caches.*`, `step.*`; outputs `logits` and `caches.*`
    (with `debug`, also `debug.index_scores.{layer}` [T, E] and `debug.topk.{layer}` [T, k]).

    With `model.dspark` the caches include `dspark.ring{s}` and `weights` must hold the context weights
    (`dspark_context.is_context_weight`); debug adds `debug.dspark.features` [T, 3H] and
    `debug.dspark.kv{s}` [T, hd] (context keys before their FP8 rounding).

    `truncated`: the truncated prefill step of `model.truncation` (its extra step inputs and, in compact,
    logits of `sample_rows` counted in the kept rows)."""
    mode = model.truncation if truncated else "off"
    if truncated and mode == "off":
        raise ValueError("trace_step: truncated=True needs a model built with truncation 'mask' or 'compact'")

    def step(weights: dict[str, Any], caches: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        f = Forward(
            model.cfg.text,
            model.num,
            weights,
            step,
            caches,
            engram_pad_id=model.engram_pad_id,
            debug={} if debug else None,
            expert_parallel=model.expert_parallel,
        )
        targets = model.cfg.text.dspark_target_layer_ids if model.dspark else ()
        return forward(f, model.plans, model.tables, tuple(targets), mode)

    return make_graph(step, dict(weights), model.cache_types(), model.step_types(truncated), name=name)
