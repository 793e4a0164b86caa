"""GPU only: captured buckets launched from C++ (cuGraphLaunch of each piece's cudaGraphExec_t through the
dlopen'ed driver; platform/cuda/runner.py) give the logits and caches of buckets replayed from Python bit
for bit, over prefill and decode buckets; and sampling lowered on the cuda platform (the sampler follows
its logits) picks the tokens and log-probs the cpu platform does from the same logits."""

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
from dsgraph.runtime import _native
from dsgraph.runtime.sampler import Sampler
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.tools.bench.model_bench import fill_caches
from dsgraph.tools.bench.steps import decode_step, pages_for, prefill_step
from tests.oracle import model_fixtures as fx

CONTEXT = 64


def _session(tmp: str, native: bool) -> Session:
    model_dir = fx.checkpoint("tiny", tmp)
    cfg = fx.config(Path(model_dir), None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 128, 16))
    weights = random_serving_weights(cfg, token_map, device="cuda")
    pages = {r: 2 * pages_for(model, r, CONTEXT) for r in ratios(model.plans)}
    s = Session(model, weights, CacheSizes(2, pages), platform="cuda")
    if not native:
        s.runner.table = None
    fill_caches(s)
    return s


@pytest.mark.gpu
def test_cpp_replay_equals_python_replay(tmp_path_factory: pytest.TempPathFactory) -> None:
    assert _native.cuda_driver_available()
    tmp = str(tmp_path_factory.getbasetemp())
    native, python = _session(tmp, True), _session(tmp, False)
    assert native.runner.table is not None
    model: Any = native.model
    for step in [prefill_step(model, 16), decode_step(model, 2, 40), decode_step(model, 2, 41)] * 2:
        assert torch.equal(native.run(step), python.run(step))
    torch.cuda.synchronize()
    assert native.captures == python.captures == 2 and len(native.runner.table) == 2
    assert sum(c.num_graphs for c in native.captured.values()) >= 2  # real graphs went through C++
    for name, cache in native.caches.items():
        assert torch.equal(cache, python.caches[name]), f"cache {name} differs"


@pytest.mark.gpu
def test_sampling_on_the_cuda_platform_matches_the_cpu_platform() -> None:
    vocab = 300
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, vocab, generator=gen) * 3
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=20),
        SamplingParams(temperature=1.3, min_p=0.05),
        SamplingParams(temperature=0.5, top_k=5, top_p=0.8),
        SamplingParams(temperature=1.0),
    ]
    seeds, positions = list(range(11, 17)), torch.arange(6, dtype=torch.int32) + 40
    sampler = Sampler(vocab, 5)
    cpu = sampler.sample(logits, params, seeds, positions)
    gpu = sampler.sample(logits.cuda(), params, seeds, positions)
    assert sorted(name for name, _ in sampler.runners) == ["cpu", "cuda"]  # each lowered on its platform
    assert torch.equal(cpu.tokens, gpu.tokens)
    assert torch.equal(cpu.top_ids, gpu.top_ids)
    torch.testing.assert_close(gpu.logprobs, cpu.logprobs, rtol=0, atol=1e-5)
    torch.testing.assert_close(gpu.top_logprobs, cpu.top_logprobs, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_greedy_tokens_without_logprobs_on_the_cuda_platform_match_the_cpu_platform() -> None:
    """All rows greedy, none asking for log-probabilities: the token-only variant (one argmax), with
    ties (integer logits) and a dead row."""
    vocab = 300
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(-3, 3, (6, vocab), generator=gen).float()
    logits[2] = float("-inf")
    params, seeds = [SamplingParams(temperature=0)] * 6, list(range(6))
    sampler = Sampler(vocab, 5)
    positions = torch.arange(6, dtype=torch.int32)
    cpu = sampler.sample(logits, params, seeds, positions)
    gpu = sampler.sample(logits.cuda(), params, seeds, positions)
    assert {graph for graph, _, _ in sampler.programs} == {"sample_greedy_token"}
    assert torch.equal(cpu.tokens, gpu.tokens) and int(gpu.tokens[2]) == -1
