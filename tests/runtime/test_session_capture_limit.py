"""Session.capture_max_tokens on the cuda platform with a cpu device (the cpu rules on device tensors,
`target.DEFAULTS`): a bucket of more query tokens than the limit runs eagerly and is never captured,
smaller buckets are captured once, and both give the logits of an all-eager session bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.platform.cuda.target import DEFAULTS
from dsgraph.runtime.engine_config import CudaConfig
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.tools.bench.steps import decode_step, pages_for, prefill_step
from tests.oracle import model_fixtures as fx

CONTEXT = 64


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, torch.Tensor]]:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    cfg = fx.config(Path(model_dir), None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 128, 16))
    return model, random_serving_weights(cfg, token_map, device="cpu")


def _session(parts: tuple[Any, dict[str, torch.Tensor]], **kw: Any) -> Session:
    model, weights = parts
    pages = {r: 2 * pages_for(model, r, CONTEXT) for r in ratios(model.plans)}
    return Session(
        model, weights, CacheSizes(2, pages), platform=DEFAULTS, device="cpu", cuda=CudaConfig(**kw)
    )


def test_buckets_over_the_limit_run_eagerly_with_the_same_logits(parts: tuple[Any, Any]) -> None:
    model = parts[0]
    limited, eager = _session(parts, capture_max_tokens=16), _session(parts, capture=False)
    prefill, decode = prefill_step(model, 32), decode_step(model, 2, 40)
    for _ in range(2):
        for step in (prefill, decode):
            assert torch.equal(limited.run(step), eager.run(step))
    assert limited.captures == 1 and [dict(k)["tokens"] for k in limited.captured] == [2]
    for name, cache in limited.caches.items():
        assert torch.equal(cache, eager.caches[name]), f"cache {name} differs"


def test_capture_max_tokens_must_be_positive() -> None:
    with pytest.raises(
        ValueError, match=r"EngineConfig.cuda.capture_max_tokens = 0: expected an integer >= 1"
    ):
        CudaConfig(capture_max_tokens=0)
