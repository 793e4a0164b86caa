"""Trace a model's step graph from a model directory without reading its weights (shapes only)."""

from __future__ import annotations

from pathlib import Path

import torch

from dsgraph.graph import Graph
from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype
from dsgraph.models.deepseek_v41.checkpoint_spec import expected_tensors
from dsgraph.models.deepseek_v41.config import load_config
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model, trace_step
from dsgraph.models.deepseek_v41.numerics import numerics_for
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.models.deepseek_v41.weights import prepare_weights, weight_types

STEP_KINDS = ("decode", "prefill")


def trace_model_step(model_dir: str, step: str, numerics: str = "serving") -> Graph:
    """The step graph of `step` for the model in `model_dir` (weights as meta tensors: no data read)."""
    if step not in STEP_KINDS:
        raise SystemExit(f"--step: {step!r} is not one of {STEP_KINDS}")
    root = Path(model_dir)
    cfg = load_config(root / "config.json")
    token_map, _ = build_token_map(load_tokenizer(root))
    num = numerics_for(numerics)
    model = build_model(cfg, token_map, num, default_geometry(cfg.text))
    meta = {
        name: torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device="meta")
        for name, spec in expected_tensors(cfg).items()
    }
    weights = prepare_weights(cfg, meta, num, token_map)
    # prefill and decode share one graph over symbolic `tokens`/`seqs`; the kind names the bucket shape
    return trace_step(model, weight_types(weights), name=f"v41_{step}")
