"""`dsgraph bench serve` against our own server on loopback (the tiny model): every request completes,
token counts are exact, the percentiles and throughputs are consistent, JSON and SVG are written."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.bench.serve_load import RequestResult, summarize
from dsgraph.tools.cli import main
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import serving


@pytest.fixture(scope="module")
def url():  # type: ignore[no-untyped-def]
    root = default_model_dir()
    app = create_app(
        Engine(root, EngineConfig.from_flat(max_model_len=128, max_num_seqs=4)),
        "tiny",
        recipe_tokenizer(root),
        api_key="k",
    )
    with serving(app) as base:
        yield base


def _run(tmp_path: Path, url: str, *extra: str) -> dict:  # type: ignore[type-arg]
    argv = ["bench", "serve", "--base-url", url, "--api-key", "k", "--num-prompts", "6", "--input-len", "8"]
    argv += ["--output-len", "4", "--out", str(tmp_path), *extra]
    assert main(argv) == 0
    (path,) = tmp_path.glob("serve-*.json")
    ET.fromstring(path.with_suffix(".svg").read_text())  # a well-formed SVG
    return json.loads(path.read_text())


def test_completions_load_with_a_concurrency_sweep(tmp_path: Path, url: str) -> None:
    result = _run(tmp_path, url, "--max-concurrency", "1,3")
    assert result["config"]["model"] == "tiny"  # found through /v1/models
    for run in result["runs"]:
        assert (run["completed"], run["failed"]) == (6, 0)
        assert run["total_input_tokens"] == 6 * 8 and run["total_output_tokens"] == 6 * 4  # ignore_eos: exact
        ttft, e2el, itl = run["ttft_s"], run["e2el_s"], run["itl_s"]
        assert 0 < ttft["median"] <= ttft["p90"] <= ttft["p99"] <= e2el["p99"]
        assert run["tpot_s"]["mean"] > 0 and itl["mean"] > 0
        assert run["output_throughput"] == pytest.approx(24 / run["duration_s"])
    assert [r["max_concurrency"] for r in result["runs"]] == [1, 3]


def test_chat_endpoint_with_a_request_rate(tmp_path: Path, url: str) -> None:
    result = _run(tmp_path, url, "--endpoint", "/v1/chat/completions", "--request-rate", "50")
    (run,) = result["runs"]
    assert run["completed"] == 6 and run["request_rate"] == 50.0 and run["total_output_tokens"] == 24


def test_a_refused_request_counts_as_failed(tmp_path: Path, url: str) -> None:
    argv = [
        "bench",
        "serve",
        "--base-url",
        url,
        "--model",
        "tiny",
        "--num-prompts",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert main([*argv, "--input-len", "4", "--output-len", "2"]) == 1  # no API key: every request is a 401
    (run,) = json.loads(next(tmp_path.glob("serve-*.json")).read_text())["runs"]
    assert run["failed"] == 2 and "HTTP 401" in run["errors"][0]


def test_summary_arithmetic() -> None:
    rs = [
        RequestResult(True, 10, 5, ttft_s=0.1, latency_s=0.5, itl_s=[0.1] * 4),
        RequestResult(True, 10, 3, ttft_s=0.3, latency_s=0.7, itl_s=[0.2] * 2),
        RequestResult(False, error="HTTP 500"),
    ]
    s = summarize(rs, 2.0, [50, 99])
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (2, 1, 8)
    assert s["tpot_s"]["mean"] == pytest.approx((0.4 / 4 + 0.4 / 2) / 2)
    assert s["ttft_s"]["median"] == pytest.approx(0.2) and s["ttft_s"]["p99"] == pytest.approx(0.298)
    assert s["output_throughput"] == 4.0 and math.isclose(s["request_throughput"], 1.0)
