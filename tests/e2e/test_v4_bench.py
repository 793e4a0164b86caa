"""`dsgraph bench v4` runs end to end on cpu (a smoke run): the random checkpoint in the released layout
loads, and every engine but vLLM (not installed on CPU machines) reports its timings and ratios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsgraph.models.deepseek_v4.config import parse_config
from dsgraph.tools.bench.v4_bench import bench_config
from dsgraph.tools.cli import main


def test_bench_config_is_the_release_width_truncated() -> None:
    cfg = parse_config(bench_config(3, None))
    assert (cfg.text.hidden_size, cfg.text.n_routed_experts, cfg.text.num_hidden_layers) == (4096, 256, 3)
    assert cfg.quant is not None and cfg.quant.weight_block_size == (128, 128)
    # vLLM builds the routing bias of its non-hash layers only when the config names the method
    assert bench_config(4, None)["topk_method"] == "noaux_tc"


@pytest.mark.slow
def test_smoke_run_on_cpu(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import dsgraph.tools.bench.v4_bench as B

    small = dict(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                 head_dim=64, qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=32,
                 num_attention_heads=4, index_n_heads=4, index_head_dim=32, vocab_size=256,
                 num_hash_layers=1, compress_rates={"compressed_sparse_attention": 4,
                 "heavily_compressed_attention": 16}, compress_ratios=[4, 16], sliding_window=8)  # fmt: skip
    real = B.bench_config
    monkeypatch.setattr(B, "bench_config", lambda layers, config: {**real(layers, config), **small})
    out = tmp_path / "v4.json"
    args = [
        "bench",
        "v4",
        "--platform",
        "cpu",
        "--layers",
        "2",
        "--dir",
        str(tmp_path / "ckpt"),
        "--batch",
        "2",
    ]
    args += [
        "--prompt-len",
        "20",
        "--decode-tokens",
        "3",
        "--engines",
        "dsgraph,transformers",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    result = json.loads(out.read_text())
    for engine in ("dsgraph", "transformers"):
        assert result["results"][engine]["decode_tokens_per_s"] > 0, result["results"][engine]
    assert result["ratios"]["dsgraph_vs_transformers"]["prefill_tokens_per_s"] > 0


def test_vllm_refused_on_an_hca_only_schedule(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with pytest.raises(SystemExit, match=r"ratio-4 layer in compress_ratios, got \[128, 128\]"):
        main(["bench", "v4", "--layers", "2", "--engines", "vllm", "--dir", str(ckpt), "--platform", "cpu"])
    assert not ckpt.exists()  # refused before the checkpoint is written


def test_unknown_engine_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--engines: unknown \['sglang'\]"):
        main(["bench", "v4", "--engines", "dsgraph,sglang", "--dir", str(tmp_path), "--platform", "cpu"])


def test_a_dir_written_for_another_schedule_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(bench_config(2, None)))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"compress_ratios": [4, 128]}))
    args = ["bench", "v4", "--layers", "2", "--config", str(other), "--engines", "", "--dir", str(tmp_path)]
    with pytest.raises(SystemExit, match=r"holds a checkpoint of .*\[128, 128\].*requested .*\[4, 128\]"):
        main(args + ["--platform", "cpu"])


def test_a_timed_out_engine_keeps_its_log(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import argparse
    import subprocess

    import dsgraph.tools.bench.v4_bench as B

    def slow(cmd, stdout, stderr, timeout):  # type: ignore[no-untyped-def]
        stdout.write("loading weights\ncompiling kernels\n")
        stdout.flush()
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(B.subprocess, "run", slow)
    args = argparse.Namespace(dir=tmp_path, batch=1, prompt_len=4, decode_tokens=1, platform="cpu",
                              out=str(tmp_path / "r.json"), timeout_s=7.0)  # fmt: skip
    result = B._measure(args, "vllm")
    assert "within --timeout-s 7" in result["error"] and "compiling kernels" in result["error"]
    assert (tmp_path / "r.vllm.log").read_text().endswith("compiling kernels\n")


def test_the_bench_writes_its_result_without_the_compiled_runtime() -> None:
    """Beside vLLM the bench runs from dsgraph's Python sources alone (its own packages are vLLM's): the
    parent, which writes the JSON after minutes of measuring, must not need `dsgraph.runtime._native`."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['dsgraph.runtime._native'] = None\n"
        "import dsgraph.tools.bench.v4_bench as b\n"
        "print('commit', b.commit())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("commit ")
