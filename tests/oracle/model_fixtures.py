"""Checkpoints and runners shared by the model-vs-oracle tests."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint
from dsgraph.models.deepseek_v41.config import ModelConfig, parse_config
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.models.deepseek_v41.tiny import make_tiny
from dsgraph.models.deepseek_v41.weights import prepare_weights
from dsgraph.runtime.step_runner import StepRunner

# A second config: other widths, window, ratios, layer count, experts, heads and Engram layers.
WIDE: dict[str, Any] = {
    "hidden_size": 96,
    "num_attention_heads": 6,
    "o_groups": 3,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 64,
    "o_lora_rank": 32,
    "moe_intermediate_size": 64,
    "n_routed_experts": 6,
    "num_experts_per_tok": 3,
    "sliding_window": 5,
    "num_hidden_layers": 8,
    "compress_ratios": [0, 0, 2, 2, 2, 1, 1, 1, 0, 0, 0],
    "kv_source_layer_ids": [2, 5],
    "index_source_layer_ids": [2, 5, 6],
    "candidate_source_layer_id": 5,
    "candidate_block_size": 4,
    "candidate_topk_blocks": 3,
    "index_n_heads": 2,
    "index_head_dim": 64,
    "index_topk": 4,
    "engram_layer_ids": [1, 4],
    "dspark_target_layer_ids": [5, 6, 7],
}
CONFIGS: dict[str, dict[str, Any]] = {"tiny": {}, "wide": WIDE}
# the tiny model with top-k and candidate limits that select everything (no tie-broken selections)
SELECT_ALL_TINY: dict[str, Any] = {"index_topk": 256, "candidate_topk_blocks": 256}
MAX_MODEL_LEN = 512
PAGE_SIZE = 16


@cache
def checkpoint(name: str, root: str) -> Path:
    overrides = SELECT_ALL_TINY if name == "tiny_select_all" else CONFIGS[name]
    return make_tiny(Path(root) / name, seed=7, overrides=overrides)


def config(model_dir: Path, text_overrides: dict[str, Any] | None) -> ModelConfig:
    raw = json.loads((model_dir / "config.json").read_text())
    raw["text_config"].update(text_overrides or {})
    return parse_config(raw)


@cache
def _stored(model_dir: Path) -> dict[str, torch.Tensor]:
    cfg = config(model_dir, None)
    return load_checkpoint(model_dir, cfg, progress=False)


def runner(
    model_dir: Path, num: Numerics, text_overrides: dict[str, Any] | None = None, **kw: Any
) -> StepRunner:
    cfg = config(model_dir, text_overrides)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, num, default_geometry(cfg.text, MAX_MODEL_LEN, PAGE_SIZE))
    return StepRunner(model, prepare_weights(cfg, _stored(model_dir), num, token_map), **kw)


def prompt(seed: int, length: int, vocab: int = 256) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab - 1, (length,), generator=gen).tolist()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())
