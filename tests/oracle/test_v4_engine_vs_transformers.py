"""The engine (scheduler, chunked prefill, decode, prefix cache) on a tiny V4 checkpoint against
transformers' DeepseekV4ForCausalLM: prompt log-probabilities and greedy tokens, in `reference` numerics,
with an indexer top-k that selects every entry (so no tie can make two correct results differ)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4")

from dsgraph.models.deepseek_v4.config import load_config  # noqa: E402
from dsgraph.models.deepseek_v4.tiny import make_tiny  # noqa: E402
from dsgraph.runtime.llm import LLM  # noqa: E402
from dsgraph.runtime.sampling_params import SamplingParams  # noqa: E402
from dsgraph.tools.bench.v4_transformers import load_tf_model, tf_logits  # noqa: E402

PROMPT = [3 + (i * 37) % 250 for i in range(70)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_tiny(tmp_path_factory.mktemp("v4") / "tiny", seed=2, overrides={"index_topk": 64}))


@pytest.fixture(scope="module")
def llm(model_dir: str) -> LLM:
    # 16-token steps: the 70-token prompt is prefilled in chunks; 4-entry pages: prefix-cache grains
    return LLM(model_dir, numerics="reference", max_model_len=256, max_num_batched_tokens=16, page_size=4)


@pytest.fixture(scope="module")
def tf(model_dir: str):  # type: ignore[no-untyped-def]
    cfg_dict = json.loads(open(f"{model_dir}/config.json").read())
    return load_tf_model(model_dir, cfg_dict, load_config(model_dir))


def test_prompt_logprobs_through_chunked_prefill(llm: LLM, tf) -> None:  # type: ignore[no-untyped-def]
    out = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    want = torch.log_softmax(tf_logits(tf, PROMPT), dim=-1)
    got = [out.prompt_logprobs[i][PROMPT[i]].logprob for i in range(1, len(PROMPT))]
    ref = [float(want[i - 1, PROMPT[i]]) for i in range(1, len(PROMPT))]
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) <= 1e-4


def test_greedy_decode_and_a_prefix_hit_follow_the_reference(llm: LLM, tf) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cold = llm.generate([{"prompt_token_ids": PROMPT}], params)[0]
    warm = llm.generate([{"prompt_token_ids": PROMPT}], params)[0]
    assert warm.num_cached_tokens > 0
    tokens = list(cold.outputs[0].token_ids)
    assert list(warm.outputs[0].token_ids) == tokens
    logits = tf_logits(tf, PROMPT + tokens[:-1])[len(PROMPT) - 1 :]
    top2 = logits.topk(2, dim=-1).values
    assert bool((top2[:, 0] - top2[:, 1] > 1e-4).all()), "a near tie: greedy choice is not decided"
    assert logits.argmax(dim=-1).tolist() == tokens
