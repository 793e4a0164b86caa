"""A V4.1 model ready to trace: config, layer roles, Engram constants, numerics and cache geometry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.models.deepseek_v41.backbone import forward
from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.context import Forward
from dsgraph.models.deepseek_v41.engram_hash import EngramLayerHash, EngramSpec, engram_primes
from dsgraph.models.deepseek_v41.layers_plan import LayerPlan, layer_plans
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.models.deepseek_v41.step_io import CacheGeometry, cache_types, step_types


@dataclass(frozen=True)
class V41Model:
    cfg: ModelConfig
    plans: tuple[LayerPlan, ...]
    tables: dict[int, EngramLayerHash]  # layer index -> hash constants
    num: Numerics
    geo: CacheGeometry
    engram_pad_id: int

    def step_types(self) -> dict[str, TensorType]:
        return step_types(self.cfg.text, self.plans, self.geo)

    def cache_types(self) -> dict[str, TensorType]:
        return cache_types(self.cfg.text, self.plans, self.geo)


def build_model(cfg: ModelConfig, token_map: list[int], num: Numerics, geo: CacheGeometry) -> V41Model:
    tables = (
        {h.layer_id: h for h in engram_primes(EngramSpec.from_text_config(cfg.text))}
        if cfg.text.engram_layer_ids
        else {}
    )
    return V41Model(cfg, layer_plans(cfg.text), tables, num, geo, token_map[cfg.text.engram_pad_token_id])


def trace_step(
    model: V41Model, weights: Mapping[str, TensorType], *, name: str = "v41_step", debug: bool = False
) -> Graph:
    """The step graph: inputs `weights.*`, `caches.*`, `step.*`; outputs `logits` and `caches.*`
    (with `debug`, also `debug.index_scores.{layer}` [T, E] and `debug.topk.{layer}` [T, k])."""

    def step(weights: dict[str, Any], caches: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        f = Forward(
            model.cfg.text,
            model.num,
            weights,
            step,
            caches,
            engram_pad_id=model.engram_pad_id,
            debug={} if debug else None,
        )
        return forward(f, model.plans, model.tables)

    return make_graph(step, dict(weights), model.cache_types(), model.step_types(), name=name)
