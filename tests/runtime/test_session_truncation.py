"""Truncated prefill steps in the Session on the cuda platform's device path with a cpu device (the cpu
rules on device tensors, `target.DEFAULTS`): every step dim, the compact layout's `kept` rows included,
is padded to its bucket; truncated buckets are captured apart from the plain graph's and replayed; the
logits equal an eager run's and the cpu platform's bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.platform.cuda.target import DEFAULTS
from dsgraph.runtime.engine_config import CudaConfig
from dsgraph.runtime.prefill_truncation import truncated_inputs
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.tools.bench.steps import decode_step, pages_for, prefill_step
from tests.oracle import model_fixtures as fx

CONTEXT = 64
KEEP = 14


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    cfg = fx.config(Path(model_dir), None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    return cfg, token_map, random_serving_weights(cfg, token_map, device="cpu")


def _session(parts: Any, mode: str, **kw: Any) -> Session:
    cfg, token_map, weights = parts
    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 128, 16), truncation=mode)
    pages = {r: 2 * pages_for(model, r, CONTEXT) for r in ratios(model.plans)}
    return Session(model, weights, CacheSizes(2, pages), **kw)


def _truncated(session: Session, chunk: int, mode: str) -> dict[str, np.ndarray]:
    step = prefill_step(session.model, chunk)
    out = truncated_inputs(step, np.array([chunk - KEEP], np.int32), mode, 8)
    assert out is not None
    return out


@pytest.mark.parametrize("mode", ["compact", "mask"])
def test_truncated_buckets_are_captured_apart_and_match_eager(parts: Any, mode: str) -> None:
    captured = _session(parts, mode, platform=DEFAULTS, device="cpu")
    eager = _session(parts, mode, platform=DEFAULTS, device="cpu", cuda=CudaConfig(capture=False))
    reference = _session(parts, mode)  # the cpu platform, unpadded
    step, decode = _truncated(captured, 40, mode), decode_step(captured.model, 2, 41)
    first = {}
    for name, s in (("prefill", step), ("decode", decode)):
        first[name] = captured.run(s).clone()
        assert torch.equal(first[name], eager.run(s)), name
        assert torch.equal(first[name], reference.run(s)), name
    assert torch.equal(captured.run(step), first["prefill"])  # the captured bucket replayed
    eager.run(step)  # the same steps on both, so their caches can be compared
    keys = [dict(k) for k in captured.captured]
    assert captured.captures == 2  # one truncated prefill bucket, one decode bucket, each once
    truncated = [k for k in keys if "~truncated" in k]
    assert len(truncated) == 1 and truncated[0]["tokens"] == 64
    if mode == "compact":
        assert truncated[0]["kept"] == 16  # 14 kept rows padded to their bucket
    for name, cache in captured.caches.items():
        assert torch.equal(cache, eager.caches[name]), f"cache {name} differs"
