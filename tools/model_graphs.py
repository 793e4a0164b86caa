"""Trace a model's graphs without reading its weights (shapes only): the target step, the drafting
session's target step (it also writes the DSpark context) and the DSpark draft pass.

Prefill and decode share the target step graph; verify is the drafting session's step graph; draft is
the drafter's. They differ in the bucket they are specialized to (`tools/inspect_cmd.py`)."""

from __future__ import annotations

from pathlib import Path

import torch

from dsgraph.graph import Graph
from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype
from dsgraph.models.deepseek_v41.checkpoint_spec import expected_tensors
from dsgraph.models.deepseek_v41.config import ModelConfig, load_config
from dsgraph.models.deepseek_v41.dspark import trace_draft
from dsgraph.models.deepseek_v41.dspark_context import is_context_weight, is_draft_weight
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import V41Model, build_model, trace_step
from dsgraph.models.deepseek_v41.numerics import numerics_for
from dsgraph.models.deepseek_v41.step_io import CacheGeometry, default_geometry
from dsgraph.models.deepseek_v41.weights import prepare_weights, weight_types

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


def trace_model_step(model_dir: str, step: str, numerics: str = "serving") -> Graph:
    """The graph that runs `step` for the model in `model_dir` (weights as meta tensors: no data read)."""
    if step not in STEP_KINDS:
        raise SystemExit(f"--step: {step!r} is not one of {STEP_KINDS}")
    root = Path(model_dir)
    cfg = load_config(root / "config.json")
    token_map, _ = build_token_map(load_tokenizer(root))
    drafting = step in ("verify", "draft")
    if drafting and cfg.text.num_nextn_predict_layers == 0:
        raise SystemExit(f"--step {step}: the model has no DSpark stages (num_nextn_predict_layers is 0)")
    meta = meta_model(cfg, token_map, default_geometry(cfg.text), dspark=drafting, numerics=numerics)
    return draft_graph(meta) if step == "draft" else step_graph(meta, f"v41_{step}")
