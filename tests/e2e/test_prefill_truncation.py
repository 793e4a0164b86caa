"""Prefill truncation in the engine (tiny model: window 8, KEEP minimum 8 + 6 = 14): chunked prefill of
batches of prompts of different lengths, mask and compact giving the same tokens and log-probs bit for
bit, requests with prompt logprobs or golden tokens exact (equal to truncation off), a KEEP below the
rule refused at start with both numbers, and the default off (equal to a run without the option)."""

from __future__ import annotations

import pytest

from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from tests.oracle import model_fixtures as fx

PROMPTS = [fx.prompt(900 + i, n) for i, n in enumerate([37, 9, 52])]
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
KW = {"max_model_len": 256, "max_num_batched_tokens": 24, "enable_prefix_cache": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def llms(model_dir):  # type: ignore[no-untyped-def]
    """One engine per mode, shared by the tests (each generate call is independent)."""
    return {
        "off": LLM(model_dir, **KW),
        "mask": LLM(model_dir, prefill_truncation="mask", **KW),
        "compact": LLM(model_dir, prefill_truncation="compact", **KW),
    }


def _run(llm: LLM, params: SamplingParams, prompts=PROMPTS):  # type: ignore[no-untyped-def]
    outs = llm.generate(prompts, params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return outs


def _tokens_and_logprobs(outs):  # type: ignore[no-untyped-def]
    return [(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob) for o in outs]


def test_mask_and_compact_agree_bit_for_bit_in_the_engine(llms) -> None:  # type: ignore[no-untyped-def]
    compact = llms["compact"]
    got_mask, got_compact = _run(llms["mask"], GREEDY), _run(compact, GREEDY)
    assert _tokens_and_logprobs(got_mask) == _tokens_and_logprobs(got_compact)
    assert [o.outputs[0].logprobs for o in got_mask] == [o.outputs[0].logprobs for o in got_compact]
    # the truncated graph ran: compact lowered programs of its own variant
    assert any(key[-1] == ("~truncated", 1) for key in compact.engine.session.programs)


def test_truncation_is_an_approximation_of_off(llms) -> None:  # type: ignore[no-untyped-def]
    off, compact = _run(llms["off"], GREEDY), _run(llms["compact"], GREEDY)
    # the 9-token prompt is shorter than KEEP: untruncated, its tokens are exact
    assert _tokens_and_logprobs(compact)[1] == _tokens_and_logprobs(off)[1]
    first = [(o.outputs[0].logprobs[0], c.outputs[0].logprobs[0]) for o, c in zip(off, compact, strict=True)]
    assert any(a != b for a, b in first)  # truncated prompts do move (an approximation, not exact)


def test_prompt_logprob_and_teacher_forced_requests_run_untruncated(llms) -> None:  # type: ignore[no-untyped-def]
    off, compact = llms["off"], llms["compact"]
    scored = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1, ignore_eos=True)
    a, b = _run(off, scored), _run(compact, scored)
    assert [o.prompt_logprobs for o in a] == [o.prompt_logprobs for o in b]
    assert _tokens_and_logprobs(a) == _tokens_and_logprobs(b)
    golden = SamplingParams(temperature=0, max_tokens=3, golden_token_ids=(5, 9, 11), ignore_eos=True)
    assert _tokens_and_logprobs(_run(off, golden)) == _tokens_and_logprobs(_run(compact, golden))
    # in the same steps as a truncated request: still exact
    mixed = [scored, golden, GREEDY]  # the 37-, 9- and 52-token prompts
    a, b = _run(off, mixed), _run(compact, mixed)
    assert a[0].prompt_logprobs == b[0].prompt_logprobs
    assert _tokens_and_logprobs(a)[:2] == _tokens_and_logprobs(b)[:2]
    assert a[2].outputs[0].logprobs[0] != b[2].outputs[0].logprobs[0]  # the 52-token prompt is truncated


def test_keep_below_window_plus_backtrack_refuses_to_start(model_dir, caplog) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"sliding_window \(8\) \+ maximum backtrack \(6\)"):
        LLM(model_dir, prefill_truncation="compact", prefill_keep_tokens=13, **KW)
    with caplog.at_level("WARNING", logger="dsgraph.engine"):
        LLM(model_dir, prefill_truncation="mask", prefill_keep_tokens=14, **KW)  # the minimum starts
    # the engine says at start that this is an approximation, with its stated bound
    assert any("approximation" in r.message and "0.20 nats" in r.message for r in caplog.records)


def test_truncation_with_prefix_hits_overlap_and_drafting(model_dir) -> None:  # type: ignore[no-untyped-def]
    """Prefix-cache hits (a replayed chunk start), overlapped steps and DSpark drafting after the prompt:
    mask and compact still give the same tokens and log-probs."""
    shared = fx.prompt(950, 40)
    prompts = [shared + fx.prompt(951 + i, 7) for i in range(2)]
    runs = {}
    for mode in ("mask", "compact"):
        cached = LLM(model_dir, prefill_truncation=mode, max_model_len=256, max_num_batched_tokens=24)
        _run(cached, GREEDY, [shared + fx.prompt(960, 5)])  # fills the prefix cache
        hits = _run(cached, GREEDY, prompts)
        assert all(o.num_cached_tokens > 0 for o in hits)
        overlapped = LLM(model_dir, prefill_truncation=mode, overlap="on", **KW)
        drafted = LLM(model_dir, prefill_truncation=mode, speculative="dspark", verify_schedule="fixed", **KW)
        runs[mode] = [_tokens_and_logprobs(hits)] + [
            _tokens_and_logprobs(_run(llm, GREEDY)) for llm in (overlapped, drafted)
        ]
    assert runs["mask"] == runs["compact"]
