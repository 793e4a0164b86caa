"""`dsgraph generate` on the embedded tiny model, and the greedy loop behind it."""

from __future__ import annotations

import pytest
import torch

from dsgraph.models.deepseek_v41.numerics import REFERENCE
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.tools.cli import main
from dsgraph.tools.generate_cmd import default_model_dir
from tests.oracle import model_fixtures as fx


def test_generate_on_embedded_default(tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["generate", "--max-tokens", "4", "--prompt", "w1 W2 w3"]) == 0
    out = capsys.readouterr().out
    assert "weights are random" in out
    assert "prompt: 'w1 W2 w3'" in out and "output: '" in out
    assert "4 tokens generated for 3 prompt tokens" in out and "tokens/s" in out
    assert "prefix cache: 0 of 3 prompt tokens served from cache (0%)" in out
    assert (tmp_path / "dsgraph" / "tiny-v41-seed0" / "config.json").exists()


def test_greedy_tokens_are_the_argmax_of_a_full_prefill(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model_dir = default_model_dir()
    prompts = [[5, 9, 11], [7, 3, 20, 40, 41, 42, 43]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = LLM(model_dir, numerics="reference", max_model_len=256).generate(prompts, params)
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    for prompt, out in zip(prompts, outs, strict=True):  # teacher-forced on a fresh runner
        tokens = list(out.outputs[0].token_ids)
        assert len(tokens) == 6
        fresh = fx.runner(model_dir, REFERENCE)
        fresh.add(0)
        logits = fresh.step([(0, prompt + tokens[:-1])])[0]
        assert torch.argmax(logits[len(prompt) - 1 :], -1).tolist() == tokens


def test_bad_prompts_name_the_problem(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    llm = LLM(default_model_dir(), numerics="reference", max_model_len=32)
    outs = llm.generate([[5], [], [5, 999], [5] * 40], SamplingParams(max_tokens=2))
    assert outs[0].error is None and len(outs[0].outputs[0].token_ids) >= 1
    assert outs[1].error == "prompt: [] must be a non-empty list of token ids"
    assert outs[2].error == "prompt: 999 must be a token id in [0, 256)"
    assert outs[3].error == "prompt: '40 tokens' must be shorter than max_model_len 32"
