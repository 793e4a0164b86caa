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


@pytest.mark.slow
def test_smoke_run_on_cpu(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import dsgraph.tools.bench.v4_bench as B

    small = dict(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                 head_dim=64, qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=32,
                 num_attention_heads=4, index_n_heads=4, index_head_dim=32, vocab_size=256,
                 num_hash_layers=1, compress_rates={"compressed_sparse_attention": 4,
                 "heavily_compressed_attention": 16}, compress_ratios=[0, 16], sliding_window=8)  # fmt: skip
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
