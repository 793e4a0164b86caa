"""CompletionOutput / RequestOutput (vLLM's shape): per-token fields line up with the tokens, finish
reasons are checked."""

from __future__ import annotations

import dataclasses

import pytest

from dsgraph.runtime.outputs import CompletionOutput, Logprob, RequestOutput


def _completion(**over: object) -> CompletionOutput:
    base: dict = {
        "index": 0,
        "text": "Hi 🎉",
        "token_ids": (5, 6, 7),
        "cumulative_logprob": -0.6,
        "logprobs": [{5: Logprob(-0.1, 1, "Hi")}, {6: Logprob(-0.2, 1)}, {7: Logprob(-0.3, 1)}],
        "finish_reason": "stop",
        "stop_reason": 1,
    }
    return CompletionOutput(**{**base, **over})


def test_request_output_holds_prompt_and_completions() -> None:
    done, running = _completion(), _completion(index=1, finish_reason=None, stop_reason=None)
    prompt_lp = [None, {3: Logprob(-1.5, 2)}, {4: Logprob(-0.25, 1)}]
    out = RequestOutput("0", "Say hi", (0, 3, 4), prompt_lp, (done, running))
    assert out.outputs[0].finished and not out.outputs[1].finished and not out.finished
    assert dataclasses.replace(out, outputs=(done,)).finished
    assert not RequestOutput("1", None, (0,), None, ()).finished
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.request_id = "2"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"finish_reason": "eos"}, r"finish_reason: 'eos' must be one of \['stop', 'length', 'abort'\]"),
        ({"logprobs": [{5: Logprob(-0.1)}]}, r"logprobs: 1 entries, expected one per token \(3\)"),
    ],
)
def test_completion_fields_are_checked(over: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _completion(**over)


def test_prompt_logprobs_need_one_entry_per_prompt_token() -> None:
    with pytest.raises(ValueError, match=r"prompt_logprobs: 2 entries, expected one per prompt token \(3\)"):
        RequestOutput("0", None, (0, 3, 4), [None, {3: Logprob(-1.0)}], (_completion(),))
