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
from dsgraph.models.deepseek_v41.dspark import trace_draft
from dsgraph.models.deepseek_v41.dspark_context import is_context_weight, is_draft_weight
from dsgraph.models.deepseek_v41.engram_map import build_token_map
from dsgraph.models.deepseek_v41.model import V41Model, build_model, trace_step
from dsgraph.models.deepseek_v41.numerics import numerics_for
from dsgraph.models.deepseek_v41.step_io import CacheGeometry, default_geometry
from dsgraph.models.deepseek_v41.weights import prepare_weights, weight_types
from dsgraph.models.registry import family_for

STEP_KINDS = ("decode", "prefill", "verify", "draft")
MetaModel = tuple[V41Model, dict[str, torch.Tensor]]


def meta_model(
    cfg: ModelConfig, token_map: list[int], geo: CacheGeometry, *, dspark: bool, numerics: str = "serving"
) -> MetaModel:
    """The model and its prepared weights as meta tensors (shapes and dtypes, no data)."""
    num = numerics_for(numerics)
    model = build_model(cfg, token_map, num, geo, dspark=dspark)
    meta = {
        name: torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device="meta")
        for name, spec in expected_tensors(cfg).items()
    }
    return model, prepare_weights(cfg, meta, num, token_map)


def step_graph(meta: MetaModel, name: str) -> Graph:
    """The target step as the session traces it: the backbone's weights, plus the DSpark context
    weights when the model writes the context (`runtime/spec_draft.py` target_weights)."""
    model, weights = meta
    target = {
        k: v
        for k, v in weights.items()
        if not k.startswith("mtp.") or (model.dspark and is_context_weight(k))
    }
    return trace_step(model, weight_types(target, backbone_only=False), name=name)


def draft_graph(meta: MetaModel) -> Graph:
    """The DSpark draft pass as the drafter traces it (`runtime/spec_draft.py` DraftRunner)."""
    model, weights = meta
    draft = {k: v for k, v in weights.items() if is_draft_weight(k)}
    return trace_draft(model, weight_types(draft, backbone_only=False))


def _meta(specs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        name: torch.empty(s.shape, dtype=torch_dtype(s.dtype), device="meta") for name, s in specs.items()
    }


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
    weights = _meta_weights(family, cfg, num, token_map, drafting)
    if step == "draft":
        draft = {k: v for k, v in weights.items() if model.is_draft_weight(k)}
        return model.trace_draft(weight_types(draft, backbone_only=False))
    target = {
        k: v
        for k, v in weights.items()
        if not k.startswith("mtp.") or (drafting and model.is_context_weight(k))
    }
    prefix = "v41" if family.model_type == "deepseek_v41" else "v4"
    return model.trace_step(weight_types(target, backbone_only=False), name=f"{prefix}_{step}")
