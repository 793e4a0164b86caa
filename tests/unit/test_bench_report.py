"""Bench arithmetic and reporting checked on CPU with hand-computed numbers (the GPU run only supplies
the times)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from dsgraph.tools.bench.extrapolate import extrapolate
from dsgraph.tools.bench.model_bench import make_model
from dsgraph.tools.bench.model_config import bench_config
from dsgraph.tools.bench.plot import pareto_svg
from dsgraph.tools.bench.traffic import active_weight_elements, distinct_experts, kv_bytes_per_request


def test_distinct_experts() -> None:
    assert distinct_experts(384, 6, 1) == pytest.approx(6)
    assert distinct_experts(384, 6, 2) == pytest.approx(6 + 6 * (1 - 6 / 384))
    assert 383 < distinct_experts(384, 6, 10_000) <= 384


def test_kv_bytes_and_active_weights_at_full_width() -> None:
    model = make_model(bench_config(), 140_000)
    # 8 layers read a 128-entry SWA window (528 B entries); 6 compressed layers read 512 selected
    # 288 B entries; Full r=2 scans 4096 index keys and Full r=1 8192 (68 B), Reindex its 8192
    want = 8 * 128 * 528 + 6 * 512 * 288 + (4096 + 8192 + 8192) * 68
    assert kv_bytes_per_request(model, 8192) == want
    assert 3.5e9 < active_weight_elements(model) < 4.5e9


def test_active_weights_of_the_released_model() -> None:
    from dsgraph.models.deepseek_v41.config import parse_config
    from dsgraph.models.deepseek_v41.flash import flash_config_dict

    # spec 1.3: about 16.1 B parameters active per decode token, embedding excluded
    model = make_model(parse_config(flash_config_dict()), 140_000)
    assert active_weight_elements(model) == pytest.approx(16.1e9, rel=0.01)


def test_extrapolation_arithmetic() -> None:
    out = {
        "decode": [{"batch": 1, "context": 8192, "ms": 10.0}, {"batch": 1, "context": 32768, "ms": 12.0}],
        "wider_decode": [{"batch": 1, "context": 8192, "ms": 14.0}],
        "prefill": [{"chunk": 4096, "ms": 100.0}],
        "wider_prefill": [{"chunk": 4096, "error": "OutOfMemoryError"}],
    }
    ex = extrapolate(out)
    d8k, d32k = ex["decode"]
    assert d8k["ms_40_layer_cost"] == pytest.approx(10.0 + 32 * 1.0)
    assert d32k["ms_40_layer_cost"] == pytest.approx(12.0 + 32 * 1.0)
    assert d32k["ms_40_scaled"] == pytest.approx(60.0)
    assert ex["prefill"][0] == {"chunk": 4096, "ms_40_scaled": 500.0, "tokens_per_s_40_scaled": 4096 / 0.5}


def test_pareto_svg_is_well_formed() -> None:
    rows = [
        {"batch": b, "context": c, "tokens_per_s_per_gpu": b * 100.0 / (1 + b / 64) / (c / 8192)}
        for c in (8192, 32768)
        for b in (1, 8, 64)
    ]
    svg = ET.fromstring(pareto_svg(rows, "tokens_per_s_per_gpu", "decode"))
    lines = [e for e in svg.iter() if e.tag.endswith("polyline")]
    assert len(lines) == 2
    xs = [float(p.split(",")[0]) for p in lines[0].get("points", "").split()]
    assert xs == sorted(xs) and len(xs) == 3
    empty = ET.fromstring(pareto_svg([], "tokens_per_s_per_gpu", "decode"))
    assert "no data" in "".join(empty.itertext())


def test_drafter_weights_are_not_decode_traffic() -> None:
    import torch

    from dsgraph.tools.bench.traffic import weight_bytes

    model = make_model(bench_config(), 9000)
    dense = {"layers.0.attn.wkv.weight": torch.empty(512, 5120, dtype=torch.float8_e4m3fn, device="meta")}
    with_mtp = {**dense, "mtp.0.main_proj.weight": torch.empty(5120, 15360, dtype=torch.uint8, device="meta")}
    assert weight_bytes(model, dense, 1) == weight_bytes(model, with_mtp, 1) == 512 * 5120
