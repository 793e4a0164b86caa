"""`dsgraph bench engine` end to end on cpu: the tiny config with random weights, batches 1 and 2, a few
steps; the JSON's fields, positive step times, one token per request a step, the differencing calls'
token counts, and the comparison with (and refusal of) a peer result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsgraph.tools import cli

# a 2-token prompt: prefill and decode of both batches run in the buckets 1, 2 and 4 only (each bucket
# lowered costs seconds on cpu)
PLAN = {"prompt_len": 2, "warmup_steps": 1, "steps": 2, "diff_k": 1, "profile_steps": 1}
FLAGS = ["--platform", "cpu", "--model", "tiny", "--batches", "1,2", "--max-model-len", "32"]
FLAGS += [f"--{k.replace('_', '-')}={v}" for k, v in PLAN.items()]


def _peer(folder: Path, **args: Any) -> Path:
    """A result in the shape vllm_bench.py writes (its figures made up for the test)."""
    rows = {str(b): {"step_ms_median": 2.0 * b, "diff_step_ms": 3.0 * b} for b in (1, 2)}
    path = folder / "vllm_bench.json"
    path.write_text(json.dumps({"vllm": "0.33.0", "args": {**PLAN, **args}, "batches": rows}))
    return path


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("bench-engine")
    out, peer = folder / "engine.json", _peer(folder)
    assert cli.main(["bench", "engine", *FLAGS, "--peer-json", str(peer), "--out", str(out)]) == 0
    return {**json.loads(out.read_text()), "peer_file": json.loads(peer.read_text())}


def test_the_result_names_the_run(result: dict[str, Any]) -> None:
    assert result["bench"] == "engine" and result["device"] == "cpu"
    assert result["commit"] and result["date"].endswith("Z")
    assert result["plan"] == {**PLAN, "batches": [1, 2]}
    options = result["options"]
    assert options["load_format"] == "dummy" and options["enable_prefix_cache"] is False
    assert options["speculative"] == "off" and result["drafting"] is False
    assert options["overlap"] == "auto" and result["overlap_on"] is False  # auto is off on cpu
    assert {k: result["engine_config"][k] for k in options} == options
    assert result["init_s"] > 0 and sorted(result["batches"]) == ["1", "2"]


@pytest.mark.parametrize("batch", [1, 2])
def test_each_batch_decodes_one_token_per_request_a_step(result: dict[str, Any], batch: int) -> None:
    row = result["batches"][str(batch)]
    assert 0 < row["step_ms_p10"] <= row["step_ms_median"] <= row["step_ms_p90"]
    assert row["step_ms_mean"] > 0 and row["prefill_steps"] >= 1
    # past prefill (one token each) and the warm-up steps
    assert row["context_at_timing"]["min"] >= PLAN["prompt_len"] + 1 + PLAN["warmup_steps"]
    assert row["tokens_per_step_mean"] == batch  # drafting off: every running request, one token
    assert row["tokens_per_s"] == pytest.approx(batch * 1e3 / row["step_ms_mean"])
    assert row["genk_tokens"] == batch * (1 + PLAN["diff_k"])
    assert row["gen1_s"] > 0 and row["genk_s"] > 0


@pytest.mark.parametrize("batch", [1, 2])
def test_the_profile_splits_a_step_into_host_phases_and_functions(result: dict[str, Any], batch: int) -> None:
    prof = result["batches"][str(batch)]["profile"]
    assert prof["steps"] == PLAN["profile_steps"]
    assert prof["device"]["step_ms_under_profiler"] > 0
    assert prof["device"]["top_kernels"] == [] and prof["device"]["kernel_busy_ms_per_step"] == 0  # cpu
    host = prof["host"]
    # on cpu the loop is plain (no overlap): it plans, runs and emits each step
    phases = host["phase_ms_per_step"]
    for name in ("runner.submit", "runner.wait", "scheduler.advance", "engine.finish_step"):
        assert 0 < phases[name] <= host["step_ms_under_cprofile"], name
    assert "runner.launch_sampled" not in phases  # the overlapped loop's launch
    top = host["top_own_time"]
    assert top and all(r["own_ms_per_step"] >= 0 for r in top)
    assert top == sorted(top, key=lambda r: r["own_ms_per_step"], reverse=True)


def test_a_peer_result_gives_ours_over_theirs(result: dict[str, Any]) -> None:
    peer, got = result["peer_file"], result["peer"]
    for batch in ("1", "2"):
        ours, theirs = result["batches"][batch], peer["batches"][batch]
        row = got["batches"][batch]
        assert row["ratio"] == pytest.approx(ours["step_ms_median"] / theirs["step_ms_median"])
        assert row["diff_ratio"] == pytest.approx(ours["diff_step_ms"] / theirs["diff_step_ms"])
        assert row["meets_target"] == (row["ratio"] <= 1.0)
    assert got["vllm"] == "0.33.0" and got["meets_target"] == all(
        r["meets_target"] for r in got["batches"].values()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [({"prompt_len": 1024}, "prompt_len is 1024 there, 2 here"), ({"steps": 64}, "steps is 64 there")],
)
def test_a_peer_run_of_other_settings_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: dict[str, int], message: str
) -> None:
    out = tmp_path / "engine.json"
    peer = _peer(tmp_path, **args)
    assert cli.main(["bench", "engine", *FLAGS, "--peer-json", str(peer), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_a_peer_missing_a_batch_and_a_short_context_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    peer = _peer(tmp_path)
    assert cli.main(["bench", "engine", *FLAGS, "--batches", "1,4", "--peer-json", str(peer)]) == 2
    assert "batches [4] were not measured there" in capsys.readouterr().err
    assert cli.main(["bench", "engine", *FLAGS, "--max-model-len", "8"]) == 2
    assert "max_model_len: 8, expected at least 16" in capsys.readouterr().err
