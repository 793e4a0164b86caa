"""The DSpark bench's step layout and policy arithmetic, checked on CPU (tiny model; hand numbers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsgraph.models.deepseek_v41.dspark_io import DraftRequest
from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.runtime.spec_draft import DraftRunner
from dsgraph.tools.bench.model_bench import fill_caches, session_for
from dsgraph.tools.bench.spec_bench import _policies, expected_tokens, verify_step
from tests.oracle import model_fixtures as fx


def test_expected_tokens_and_policies() -> None:
    p = (0.5, 0.5, 0.0, 0.0, 0.0)
    assert expected_tokens(p, 0) == 1.0
    assert expected_tokens(p, 2) == pytest.approx(1.75)
    assert expected_tokens(p, 5) == pytest.approx(1.75)
    t = {k: 10.0 for k in range(6)}  # verifying is free: the planner takes the drafts worth anything
    out = _policies(4, t, 2.0, p)
    assert out["off_tokens_per_s"] == pytest.approx(400.0)
    assert out["fixed5_tokens_per_s"] == pytest.approx(4 * 1.75 / 0.012)
    assert out["confidence_tokens_per_s"] == pytest.approx(4 * 1.75 / 0.012)
    assert out["confidence_drafts_per_request"] == 2  # zero-probability drafts are never verified
    steep = {k: 10.0 * (1 + k) for k in range(6)}  # each draft row costs a full step: never worth it
    assert _policies(4, steep, 2.0, p)["confidence_drafts_per_request"] == 0


def test_verify_steps_and_draft_passes_run_on_the_tiny_model(tmp_path: Path) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path))
    cfg = fx.config(model_dir, None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 128, 16), dspark=True)
    weights = random_serving_weights(cfg, token_map, device="cpu", dspark=True)
    session = session_for(model, weights, 3, 96, platform="cpu")
    fill_caches(session)
    for k in (0, 3, 5):
        logits = session.run(verify_step(model, 3, 90, k))
        assert logits.shape == (3 * (1 + k), cfg.text.vocab_size) and bool(torch.isfinite(logits).all())
    out = DraftRunner(session, weights).run([DraftRequest(anchor=1, position=89, slot=b) for b in range(3)])
    assert out.tokens.shape == (3, cfg.text.dspark_block_size)
