"""Defaults never change results: prefix caching leaves greedy tokens as a cold run gives them, and
prompt log-probabilities come back complete (and equal to a cold run's) when the prefix is cached."""

from __future__ import annotations

import pytest

from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from tests.oracle import model_fixtures as fx

SHARED = fx.prompt(700, 96)  # three 32-token grains: the whole shared part can be a hit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


def test_greedy_tokens_after_a_sibling_equal_a_cold_run_by_default(model_dir) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [SHARED + fx.prompt(701 + i, 7) for i in range(4)]
    cold = [LLM(model_dir, max_model_len=256).generate([p], params)[0] for p in prompts]
    llm = LLM(model_dir, max_model_len=256)  # the defaults
    llm.generate([SHARED + fx.prompt(799, 5)], params)  # the sibling fills the prefix cache
    warm = [llm.generate([p], params)[0] for p in prompts]
    assert all(w.num_cached_tokens == 96 for w in warm)  # every one of them hit the cache
    assert [w.outputs[0].token_ids for w in warm] == [c.outputs[0].token_ids for c in cold]


def test_prompt_logprobs_are_complete_and_cold_with_a_prefix_hit(model_dir) -> None:  # type: ignore[no-untyped-def]
    prompt = SHARED + fx.prompt(710, 6)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    cold = LLM(model_dir, max_model_len=256).generate([prompt], params)[0]
    llm = LLM(model_dir, max_model_len=256)
    llm.generate([SHARED + fx.prompt(711, 4)], SamplingParams(temperature=0, max_tokens=2))
    warm = llm.generate([prompt], params)[0]
    assert cold.prompt_logprobs is not None and warm.prompt_logprobs is not None
    assert warm.prompt_logprobs[0] is None and len(warm.prompt_logprobs) == len(prompt)
    assert all(entry is not None for entry in warm.prompt_logprobs[1:])
    for pos in range(1, len(prompt)):
        assert warm.prompt_logprobs[pos] == cold.prompt_logprobs[pos], pos
    # the sibling without prompt logprobs still shares its prefix with later requests
    assert llm.engine.prefix_cache_stats()[1] >= 0
