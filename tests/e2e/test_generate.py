"""`dsgraph generate` on the embedded tiny model, and the greedy loop behind it."""

from __future__ import annotations

import pytest
import torch

from dsgraph.runtime.generate import greedy_generate
from dsgraph.runtime.loader import load_runner
from dsgraph.tools.cli import main


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
    from dsgraph.tools.generate_cmd import default_model_dir

    model_dir = default_model_dir()
    runner, _ = load_runner(model_dir, "reference", 256)
    prompts = [[5, 9, 11], [7, 3, 20, 40, 41, 42, 43]]
    gens, stats = greedy_generate(runner, prompts, 6, eos_id=None)
    assert stats.generated_tokens == 12 and all(g.finish_reason == "length" for g in gens)
    for gen in gens:  # teacher-forced check on a fresh runner: each token is the argmax at its position
        fresh, _ = load_runner(model_dir, "reference", 256)
        fresh.add(0)
        seq = gen.prompt_ids + gen.token_ids
        logits = fresh.step([(0, seq[:-1])])[0]
        assert torch.argmax(logits[len(gen.prompt_ids) - 1 :], -1).tolist() == gen.token_ids


def test_bad_prompts_name_the_problem(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from dsgraph.tools.generate_cmd import default_model_dir

    runner, _ = load_runner(default_model_dir(), "reference", 32)
    with pytest.raises(ValueError, match=r"prompts\[1\]: empty prompt"):
        greedy_generate(runner, [[5], []], 2, None)
    with pytest.raises(ValueError, match=r"prompts\[0\]: token id 999 outside \[0, 256\)"):
        greedy_generate(runner, [[5, 999]], 2, None)
    with pytest.raises(ValueError, match=r"prompts\[0\]: 40 tokens, max_model_len is 32"):
        greedy_generate(runner, [[5] * 40], 2, None)
