"""Prefill truncation on the cuda platform (GPU only): the truncated prefill steps are captured per
bucket in their own row layout (a bucket per tokens x kept rows, apart from the plain graph's), replays
reuse them, mask and compact give the same tokens as the cpu engine's compact run, and the bench's
prefill part runs at a small size."""

from __future__ import annotations

import pytest
import torch

from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from tests.oracle import model_fixtures as fx

PROMPTS = [fx.prompt(910 + i, n) for i, n in enumerate([41, 9, 66, 23, 100])]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
KW = {
    "numerics": "reference",  # the serving-numerics tiny model is chaotic (test_e2e_gpu.py)
    "max_model_len": 256,
    "max_num_batched_tokens": 32,
    "enable_prefix_cache": False,
    "speculative": "off",
}


def _tokens(llm: LLM) -> list[tuple[int, ...]]:
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.error for o in outs] == [None] * len(outs)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.gpu
def test_truncated_prefill_is_captured_per_bucket(tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    cpu = _tokens(LLM(model_dir, platform="cpu", prefill_truncation="compact", **KW))
    gpu = LLM(model_dir, platform="cuda", prefill_truncation="compact", **KW)
    assert _tokens(gpu) == cpu
    session = gpu.engine.session
    truncated = [k for k in session.captured if k[-1] == ("~truncated", 1)]
    assert truncated, "no truncated prefill bucket was captured"
    assert all(dict(k)["kept"] <= dict(k)["tokens"] for k in truncated)
    captures = session.captures
    assert _tokens(gpu) == cpu
    assert session.captures == captures  # every bucket was seen by the first run
    mask = LLM(model_dir, platform="cuda", prefill_truncation="mask", **KW)
    assert _tokens(mask) == cpu


@pytest.mark.gpu
def test_bench_prefill_part_small() -> None:
    from dsgraph.models.deepseek_v41.config import parse_config
    from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
    from dsgraph.models.deepseek_v41.tiny import tiny_config_dict
    from dsgraph.tools.bench.model_bench import synthetic_token_map
    from dsgraph.tools.bench.prefill_truncation import truncation_prefill_cases

    cfg = parse_config(tiny_config_dict())
    weights = random_serving_weights(cfg, synthetic_token_map(cfg), device="cuda")
    out = truncation_prefill_cases(cfg, weights, (64, 256), platform="cuda")
    for row in out["cases"]:
        assert row["compact"]["decoder_rows"] == out["keep"], row
        assert row["compact"]["finite_logits"] and row["compact"]["captured"], row
        assert "speedup_compact" in row, row
    assert torch.cuda.is_available()
