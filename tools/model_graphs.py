"""Trace a model's graphs without reading its weights (shapes only): the target step, the drafting
session's target step (it also writes the draft context) and the draft pass. `trace_model_step` serves
`dsgraph inspect` for either family (models/registry.py); `meta_model`, `step_graph` and `draft_graph`
build V4.1's for the goldens (tools/graph_dumps.py).

Prefill and decode share the target step graph; verify is the drafting session's step graph; draft is
the drafter's. They differ in the bucket they are specialized to (`tools/inspect_cmd.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dsgraph.graph import Graph
from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype
from dsgraph.models.deepseek_v41.checkpoint_spec import expected_tensors
from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.engram_map import build_token_map
from dsgraph.models.deepseek_v41.model import V41Model, build_model
from dsgraph.models.deepseek_v41.numerics import numerics_for
from dsgraph.models.deepseek_v41.step_io import CacheGeometry, default_geometry
from dsgraph.models.deepseek_v41.weights import prepare_weights, weight_types
from dsgraph.models.registry import family_for
from dsgraph.runtime.spec_draft import target_weights

STEP_KINDS = ("decode", "prefill", "verify", "draft")
MetaModel = tuple[V41Model, dict[str, torch.Tensor]]


def _meta(specs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Meta tensors (shapes and dtypes, no data) of checkpoint tensor specs."""
    return {
        name: torch.empty(s.shape, dtype=torch_dtype(s.dtype), device="meta") for name, s in specs.items()
    }


def meta_model(
    cfg: ModelConfig, token_map: list[int], geo: CacheGeometry, *, dspark: bool, numerics: str = "serving"
) -> MetaModel:
    """The V4.1 model and its prepared weights as meta tensors."""
    num = numerics_for(numerics)
    model = build_model(cfg, token_map, num, geo, dspark=dspark)
    return model, prepare_weights(cfg, _meta(expected_tensors(cfg)), num, token_map)


def step_graph(meta: tuple[Any, dict[str, Any]], name: str) -> Graph:
    """The target step as the session traces it (`runtime/spec_draft.py` target_weights: the backbone's
    weights, plus the draft context weights when the model writes the context)."""
    model, weights = meta
    return model.trace_step(weight_types(target_weights(model, weights), backbone_only=False), name=name)


def draft_graph(meta: tuple[Any, dict[str, Any]]) -> Graph:
    """The draft pass as the drafter traces it (`runtime/spec_draft.py` DraftRunner)."""
    model, weights = meta
    draft = {k: v for k, v in weights.items() if model.is_draft_weight(k)}
    return model.trace_draft(weight_types(draft, backbone_only=False))


def _meta_weights(family: Any, cfg: Any, num: Any, token_map: list[int], drafting: bool) -> dict[str, Any]:
    """The prepared weights as meta tensors; V4's MTP layer (this project's layout, not in the release's
    tensor list) when drafting."""
    if drafting and family.model_type == "deepseek_v4":
        from dsgraph.models.deepseek_v4.checkpoint_load import with_mtp
        from dsgraph.models.deepseek_v4.mtp import mtp_tensors

        return with_mtp(cfg, _meta({**family.expected_tensors(cfg), **mtp_tensors(cfg)}), num)
    return family.prepare_weights(cfg, _meta(family.expected_tensors(cfg)), num, token_map)


def trace_model_step(model_dir: str, step: str, numerics: str = "serving") -> Graph:
    """The graph that runs `step` for the model in `model_dir`, of either family (models/registry.py:
    V4.1's draft pass is DSpark's, V4's its MTP layer's); weights as meta tensors: no data read."""
    if step not in STEP_KINDS:
        raise SystemExit(f"--step: {step!r} is not one of {STEP_KINDS}")
    root = Path(model_dir)
    family = family_for(root)
    cfg = family.load_config(root)
    drafting = step in ("verify", "draft")
    if drafting and cfg.text.num_nextn_predict_layers == 0:
        raise SystemExit(f"--step {step}: the model has no draft layers (num_nextn_predict_layers is 0)")
    tokenizer = family.load_tokenizer(root, cfg)
    token_map = build_token_map(tokenizer)[0]  # V4.1's Engram map; V4's preparation ignores it
    num = numerics_for(numerics)
    model = family.build(cfg, tokenizer, num, default_geometry(cfg.text), drafting)
    meta = (model, _meta_weights(family, cfg, num, token_map, drafting))
    if step == "draft":
        return draft_graph(meta)
    prefix = "v41" if family.model_type == "deepseek_v41" else "v4"
    return step_graph(meta, f"{prefix}_{step}")
