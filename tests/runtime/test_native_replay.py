"""Bucket replay from C++ (runtime/csrc/graph_replay.h, platform/cuda/runner.py): the native table picks a
captured bucket by its sizes and runs its phases in order; on a cpu device (the cuda platform's cpu rules,
`target.DEFAULTS`) every phase is a host callback, and a session replayed from C++ gives the logits and
caches of one replayed from Python bit for bit."""

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
from dsgraph.platform.cuda.runner import native_key
from dsgraph.platform.cuda.target import DEFAULTS
from dsgraph.runtime import _native
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.tools.bench.steps import decode_step, pages_for, prefill_step
from tests.oracle import model_fixtures as fx

CONTEXT = 48


def test_table_runs_phases_in_order_and_names_unknown_buckets() -> None:
    table, calls = _native.ReplayTable(), []
    table.add([4, 1, 2], [lambda: calls.append("a"), lambda: calls.append("b")])
    table.add([8, 1, 2], [lambda: calls.append("c")])
    table.launch([4, 1, 2])
    table.launch([8, 1, 2])
    table.launch([4, 1, 2])
    assert calls == ["a", "b", "c", "a", "b"] and len(table) == 2 and [8, 1, 2] in table
    with pytest.raises(IndexError, match=r"no captured bucket \(2, 1, 2\)"):
        table.launch([2, 1, 2])
    with pytest.raises(ValueError, match="exec handle of 0"):
        table.add([1], [0])
    with pytest.raises(TypeError, match="graph exec handle"):
        table.add([1], ["not a phase"])

    def fails() -> None:
        raise RuntimeError("from the callback")

    table.add([16], [fails])
    with pytest.raises(RuntimeError, match="from the callback"):  # a host step's error reaches Python
        table.launch([16])


def test_native_key_keeps_the_sizes_in_order() -> None:
    assert native_key((("outs", 2), ("seqs", 2), ("tokens", 4), ("~truncated", 1))) == [2, 2, 4, 1]
    assert native_key(4) == [4]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, torch.Tensor]]:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    cfg = fx.config(Path(model_dir), None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 128, 16))
    return model, random_serving_weights(cfg, token_map, device="cpu")


def _session(parts: tuple[Any, Any], native: bool, monkeypatch: pytest.MonkeyPatch) -> Session:
    model, weights = parts
    monkeypatch.setenv("DSGRAPH_NATIVE_REPLAY", "1" if native else "0")
    pages = {r: 2 * pages_for(model, r, CONTEXT) for r in ratios(model.plans)}
    return Session(model, weights, CacheSizes(2, pages), platform=DEFAULTS, device="cpu")


def test_session_replayed_from_cpp_equals_python_replay(parts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    native, python = _session(parts, True, monkeypatch), _session(parts, False, monkeypatch)
    assert native.runner.table is not None and python.runner.table is None
    model = parts[0]
    for step in (prefill_step(model, 8), decode_step(model, 2, 20), decode_step(model, 2, 21)):
        assert torch.equal(native.run(step), python.run(step))
    assert native.captures == python.captures == 2 and len(native.runner.table) == 2
    assert all(native_key(k) in native.runner.table for k in native.captured)
    assert sum(c.replays for c in native.captured.values()) == 3
    for name, cache in native.caches.items():
        assert torch.equal(cache, python.caches[name]), f"cache {name} differs"
