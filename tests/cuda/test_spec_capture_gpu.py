"""The DSpark draft pass captured in CUDA graphs on the GPU (runtime/spec_draft.py): greedy tokens with
captured drafting equal a non-drafting run, every draft bucket is captured once (no recapture when the
same prompts run again), and on the full cuda platform (Triton kernels) the draft graph is captured
whole: no step, the in-graph `sample` and `sampling_logprobs` included, runs eagerly; its drafts,
confidences and log-probs equal the eager pass's bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.runtime.spec_draft import DraftRunner
from dsgraph.tools.bench.model_bench import fill_caches
from dsgraph.tools.bench.steps import pages_for
from tests.cuda.test_engine_gpu import _tokens as engine_tokens
from tests.oracle import model_fixtures as fx
from tests.runtime.test_spec_draft_capture import CONTEXT, SLOTS, assert_same, copied, requests

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
CURVE = ((8, 64, 256), (1.0, 1.2, 2.0))


def _tokens(llm: LLM) -> list[tuple[int, ...]]:
    return engine_tokens(llm, GREEDY)  # test_engine_gpu's prompts; no request may fail


@pytest.mark.gpu
def test_captured_drafting_keeps_greedy_tokens(tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    kw = {"numerics": "reference", "max_model_len": 256, "platform": "cuda"}
    plain = _tokens(LLM(model_dir, speculative="off", **kw))
    llm = LLM(model_dir, speculative="dspark", throughput_curve=CURVE, draft_pause=False, **kw)
    spec = llm.engine.spec
    assert spec is not None and spec.drafter.capture
    assert _tokens(llm) == plain
    drafter = spec.drafter
    assert drafter.draft_captures == len(drafter.captured) > 0, drafter.as_text()
    passes, captures = llm.engine.spec_stats()["draft_passes"], drafter.draft_captures  # type: ignore[index]
    assert passes > captures  # replays, not only captures
    assert _tokens(llm) == plain
    # no bucket is captured twice (which buckets draft depends on the planner's measured times, so the
    # second run may meet a new one)
    assert drafter.draft_captures == len(drafter.captured) >= captures


@pytest.mark.gpu
def test_draft_graph_is_captured_whole_and_equals_eager(tmp_path: Path) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path))
    cfg = fx.config(Path(model_dir), None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 128, 16), dspark=True)
    weights = random_serving_weights(cfg, token_map, device="cuda", dspark=True)
    pages = {r: SLOTS * pages_for(model, r, CONTEXT) for r in ratios(model.plans)}
    session = Session(model, weights, CacheSizes(SLOTS, pages), platform="cuda")
    fill_caches(session)
    runner = DraftRunner(session, weights)
    for step, n in enumerate([1, 3, 2, 3, 1, 4]):
        got = copied(runner.run(requests(n, step)))
        assert_same(got, runner.run(requests(n, step), capture=False), f"pass {step} ({n} requests)")
    # pass 0's one request is greedy (the greedy variant's bucket 1), passes 1-3 and 5 mix greedy and
    # sampled rows (full buckets 4 and 2), pass 4's one request samples (full bucket 1)
    assert set(runner.captured) == {(1, "greedy"), 1, 2, 4} and runner.draft_captures == 4
    for seqs, captured in runner.captured.items():
        assert captured.num_eager == 0 and captured.num_graphs == 1, f"bucket {seqs}: {runner.as_text()}"
    assert torch.cuda.is_available()
