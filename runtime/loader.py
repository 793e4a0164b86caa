"""Load a model directory into a ready step runner (cpu platform) and its tokenizer."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint
from dsgraph.models.deepseek_v41.config import load_config
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import numerics_for
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.models.deepseek_v41.weights import prepare_weights
from dsgraph.runtime.step_runner import StepRunner


def load_runner(
    model_dir: Path, numerics: str = "serving", max_model_len: int = 1024
) -> tuple[StepRunner, Tokenizer]:
    cfg = load_config(model_dir)
    tokenizer = load_tokenizer(model_dir)
    token_map, _ = build_token_map(tokenizer)
    num = numerics_for(numerics)
    max_len = min(max_model_len, cfg.text.max_position_embeddings)
    model = build_model(cfg, token_map, num, default_geometry(cfg.text, max_len, page_size=16))
    weights = prepare_weights(cfg, load_checkpoint(model_dir, cfg), num, token_map)
    pages = -(-max_len // 16) * 4  # room for a few full-length requests per ratio
    return StepRunner(model, weights, num_slots=16, num_pages=pages), tokenizer
