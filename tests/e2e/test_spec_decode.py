"""Deterministic speculative decoding end to end (cpu, tiny random checkpoint): with `deterministic=True`
seeded sampling emits exactly the tokens of a run without drafting, whatever the batch size (1, 7, 32),
the chunk size (max_num_batched_tokens), the verify schedule (confidence on or fixed) and the number of
drafts accepted (a hook feeds the target's own continuation, cut at varying places) or the steps whose
draft pass is paused; and
`dsgraph generate` prints the drafting statistics."""

from __future__ import annotations

from typing import Any

import pytest

from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.tools.cli import main
from tests.engine_faults import draft_hook
from tests.oracle import model_fixtures as fx
from tests.runtime.test_spec_engine import CURVE  # flat up to 32 rows: confident drafts are verified

PROMPTS = [fx.prompt(900 + i, 1 + (7 * i) % 19) for i in range(32)]
PARAMS = [
    SamplingParams(temperature=1.0, top_p=0.9 if i % 2 else 1.0, seed=100 + i, max_tokens=7, ignore_eos=True)
    for i in range(32)
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def reference(model_dir) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=64, max_num_seqs=32, speculative="off")
    return tokens(llm, PROMPTS, PARAMS)


def tokens(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple[int, ...]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def det_llm(model_dir, **kw: Any) -> LLM:  # type: ignore[no-untyped-def]
    base: dict[str, Any] = dict(
        max_model_len=64, speculative="dspark", deterministic=True, throughput_curve=CURVE
    )
    return LLM(model_dir, **{**base, **kw})


def hook_reference(llm: LLM, reference: list[tuple[int, ...]]) -> None:
    """Drafts = the reference continuation with the draft at (call count % 6) made wrong."""
    eng, by_prompt, calls = llm.engine, dict(zip(map(tuple, PROMPTS), reference, strict=True)), [0]

    def hook(rid: int, position: int, drafts: list[int], conf: list[float]):  # type: ignore[no-untyped-def]
        live = eng.live[rid]
        first = position + 1 - len(live.prompt)
        d = list(by_prompt[tuple(live.prompt)][first : first + 5])
        right, calls[0] = calls[0] % 6, calls[0] + 1
        if right < len(d):
            d[right] = (d[right] + 1) % eng.cfg.text.vocab_size
        return d, [0.9] * len(d)

    draft_hook(eng).fn = hook


def test_batch_of_32_equals_no_drafting(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    llm = det_llm(model_dir, max_num_seqs=32)
    assert tokens(llm, PROMPTS, PARAMS) == reference
    assert llm.engine.spec_stats()["verified_tokens"] > 0  # type: ignore[index]


@pytest.mark.parametrize(
    ("kw", "subset"),
    [
        (dict(max_num_seqs=7), slice(0, 32)),
        (dict(max_num_seqs=1), slice(0, 3)),
        (dict(max_num_seqs=8, max_num_batched_tokens=16), slice(0, 32)),
        (dict(max_num_seqs=7, verify_schedule="fixed"), slice(5, 20)),
    ],
)
def test_tokens_do_not_depend_on_batch_chunks_or_schedule(model_dir, reference, kw, subset) -> None:  # type: ignore[no-untyped-def]
    llm = det_llm(model_dir, **kw)
    assert tokens(llm, PROMPTS[subset], PARAMS[subset]) == reference[subset]


@pytest.mark.parametrize("schedule", ["confidence", "fixed"])
def test_tokens_do_not_depend_on_accepted_drafts(model_dir, reference, schedule: str) -> None:  # type: ignore[no-untyped-def]
    llm = det_llm(model_dir, max_num_seqs=7, verify_schedule=schedule, draft_pause=False)  # every length
    hook_reference(llm, reference)
    assert tokens(llm, PROMPTS[:14], PARAMS[:14]) == reference[:14]
    stats: Any = llm.engine.spec_stats()
    assert stats["accepted_tokens"] > 0 and stats["reached_at"][0] > stats["accepted_at"][0]
    if schedule == "fixed":  # every acceptance length 0..5 occurred
        assert all(n > 0 for n in stats["accepted_at"])


@pytest.mark.parametrize("cost", [None, ((1, 8), (1000.0, 1000.0))])
def test_pausing_keeps_the_tokens(model_dir, reference, cost: Any) -> None:  # type: ignore[no-untyped-def]
    """Paused steps are plain decode rows (the measured draft cost of a cpu run, or a dear one that
    pauses for sure): the tokens stay those of a run without drafting, drafts right or wrong."""
    llm = det_llm(model_dir, max_num_seqs=7, draft_cost=cost)
    hook_reference(llm, reference)
    assert tokens(llm, PROMPTS[:14], PARAMS[:14]) == reference[:14]
    stats: Any = llm.engine.spec_stats()
    assert stats["verified_tokens"] > 0 and (cost is None or stats["paused_steps"] > stats["draft_passes"])


def test_generate_prints_drafting_statistics(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    args = ["generate", "--max-tokens", "5", "--prompt", "w1 W2 w3", "--speculative", "dspark"]
    assert main([*args, "--verify-schedule", "fixed"]) == 0
    out = capsys.readouterr().out
    assert "5 tokens generated" in out
    assert "speculative (fixed): " in out and "drafts accepted (rate " in out and "per position" in out
    assert "calibration error" in out
    assert main(["generate", "--max-tokens", "2", "--prompt", "w1", "--speculative", "off"]) == 0
    assert "speculative" not in capsys.readouterr().out
