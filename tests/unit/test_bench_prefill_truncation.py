"""`dsgraph bench --parts prefill` at a tiny size on the cpu platform: truncation off, mask and compact of
the same prompts in one run, compact's decoder on KEEP rows, mask and compact logits equal, the
speed-up of each over off reported."""

from __future__ import annotations

import argparse

from dsgraph.models.deepseek_v41.config import parse_config
from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.models.deepseek_v41.tiny import tiny_config_dict
from dsgraph.tools.bench.model_bench import synthetic_token_map
from dsgraph.tools.bench.prefill_truncation import truncation_prefill_cases, wall_ms

WIDER = {
    "num_hidden_layers": 8,
    "compress_ratios": [0, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0],
    "kv_source_layer_ids": [1, 4],
    "index_source_layer_ids": [1, 4, 5],
    "candidate_source_layer_id": 4,
    "dspark_target_layer_ids": [5, 6, 7],
}


def test_prefill_part_compares_the_modes_in_one_run() -> None:
    cfg = parse_config(tiny_config_dict())
    weights = random_serving_weights(cfg, synthetic_token_map(cfg), seed=1, device="cpu")
    # a 2-layer-wider tiny model (one more Reuse layer each side of the boundary) for the extrapolation
    wider_cfg = parse_config(tiny_config_dict(**WIDER))
    wider = (wider_cfg, random_serving_weights(wider_cfg, synthetic_token_map(wider_cfg), device="cpu"))
    once = lambda fn: wall_ms(fn, warmup=0, repeats=1)  # noqa: E731  (a CI run times nothing)
    out = truncation_prefill_cases(cfg, weights, (48,), platform="cpu", timer=once, wider=wider)
    assert out["keep"] == 8 + 6  # the tiny window + the maximum backtrack
    assert [row["chunk"] for row in out["cases"]] == [48]
    for row in out["cases"]:
        for mode in ("off", "mask", "compact"):
            assert "error" not in row[mode], row
            assert row[mode]["finite_logits"] and row[mode]["tokens_per_s"] > 0, row
        assert row["off"]["decoder_rows"] == row["mask"]["decoder_rows"] == row["chunk"]
        assert row["compact"]["decoder_rows"] == out["keep"]
        assert row["mask_compact_max_abs_diff"] == 0.0  # the same numbers on the kept rows
        assert row["compact_off_max_abs_diff"] > 0.0  # an approximation: the last row's logits move
        assert row["speedup_compact"] > 0 and row["speedup_mask"] > 0
        assert row["wider_compact"]["decoder_rows"] == out["keep"]
        extra = row["extrapolated_40_layers"]
        assert extra["label"].startswith("extrapolated") and extra["speedup_compact"] > 0


def test_bench_accepts_the_prefill_part() -> None:
    from dsgraph.tools import bench_cmd

    assert "prefill" in bench_cmd.PARTS
    parser = argparse.ArgumentParser()
    bench_cmd.add_parser(parser.add_subparsers())
    assert parser.parse_args(["bench", "--parts", "prefill", "--quick"]).parts == "prefill"
