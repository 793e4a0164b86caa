"""The offline API as a vLLM user writes it: top-level imports, every prompt form, chat rendered as the
server renders it, and SamplingParams' vLLM fields (min_tokens, stop_reason, include_stop_str_in_output,
skip_special_tokens) on the tiny random checkpoint."""

from __future__ import annotations

import re

import pytest

import dsgraph
from dsgraph import LLM, CompletionOutput, Logprob, RequestOutput, SamplingParams
from tests.oracle import model_fixtures as fx

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    return LLM(fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp())), max_model_len=256)


def test_top_level_names() -> None:
    assert {"LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"} <= set(dir(dsgraph))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        dsgraph.NoSuchThing  # noqa: B018


def test_every_prompt_form_alone_or_in_a_list(llm: LLM) -> None:
    text = "w1 W2 w3"
    ids = llm.tokenizer.encode(text).ids
    forms = [text, ids, {"prompt": text}, {"prompt_token_ids": ids}]
    together = llm.generate(forms, GREEDY)
    alone = [llm.generate(form, GREEDY)[0] for form in forms]
    for out in together + alone:
        assert isinstance(out, RequestOutput) and isinstance(out.outputs[0], CompletionOutput)
        assert out.prompt_token_ids == tuple(ids) and out.error is None
        assert out.outputs[0].token_ids == together[0].outputs[0].token_ids
    assert together[0].prompt == text and together[2].prompt == text and together[1].prompt is None
    assert len({o.request_id for o in together + alone}) == 8  # unique, as vLLM's


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"prompt": "a", "prompt_token_ids": [3]}, "prompt: .* exactly one of"),
        ({"text": "a"}, "text: 'a' must be absent"),
        ({"prompt": 5}, "prompt: 5 must be a string"),
        ({"prompt_token_ids": ["x"]}, r"prompt: \['x'\] must be a string, a list of token ids"),
        ({"prompt_token_ids": []}, "prompt: .* non-empty"),
    ],
)
def test_a_malformed_prompt_fails_alone_naming_the_field(llm: LLM, bad: dict, message: str) -> None:
    out = llm.generate([bad, "w1 W2"], GREEDY)
    assert out[0].error is not None and out[0].outputs == ()
    assert re.search(message, out[0].error), out[0].error
    assert out[1].error is None and len(out[1].outputs[0].token_ids) == 6


def test_chat_renders_exactly_as_the_server(llm: LLM) -> None:
    from dsgraph.runtime.server.apis import CHAT
    from dsgraph.runtime.server.protocol import conversion_options, prepare, recipe_tokenizer

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "w1 W2"}]
    out = llm.chat(messages, GREEDY)
    body = {"model": "m", "messages": messages, "max_tokens": 6}  # parsed, as limits.parse_json gives it
    served = prepare(
        CHAT, body, conversion_options("m", False), recipe_tokenizer(llm.model_dir), llm.tokenizer, 256
    )
    assert list(out[0].prompt_token_ids) == served.prompt_ids
    assert (
        out[0].outputs[0].token_ids
        == llm.generate({"prompt_token_ids": served.prompt_ids}, GREEDY)[0].outputs[0].token_ids
    )
    thinking = llm.chat([messages, messages], GREEDY, thinking=True)
    assert len(thinking) == 2 and thinking[0].prompt_token_ids != out[0].prompt_token_ids
    with pytest.raises(ValueError, match="messages"):
        llm.chat([{"role": "nobody", "content": 3}])


def test_min_tokens_masks_stop_token_ids_and_eos(llm: LLM) -> None:
    first = llm.generate("w1 W2", GREEDY)[0].outputs[0].token_ids[0]
    stopped = llm.generate("w1 W2", SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[first]))[0]
    assert stopped.outputs[0].token_ids == (first,) and stopped.outputs[0].stop_reason == first
    held = SamplingParams(temperature=0, max_tokens=6, min_tokens=3, stop_token_ids=[first])
    out = llm.generate("w1 W2", held)[0].outputs[0]
    assert len(out.token_ids) >= 3 and first not in out.token_ids[:3]


def test_min_tokens_mask_rows_cover_eos_unless_ignored() -> None:
    from types import SimpleNamespace

    import numpy as np
    import torch

    from dsgraph.runtime.prompt_logprobs import mask_rows, min_tokens_mask

    plan = SimpleNamespace(  # two sequences: rows 0..2 verify drafts of request 7, row 3 decodes request 8
        verify_start=np.array([0, 3]), verify_len=np.array([3, 1]), seq_rids=np.array([7, 8]), num_seqs=2
    )
    live = {
        7: SimpleNamespace(params=SamplingParams(max_tokens=9, min_tokens=3, stop_token_ids=[4]), tokens=[9]),
        8: SimpleNamespace(params=SamplingParams(max_tokens=9, min_tokens=1, ignore_eos=True), tokens=[]),
    }
    hits = min_tokens_mask(plan, live, eos_id=1)
    assert sorted(hits) == [(0, 1), (0, 4), (1, 1), (1, 4)]  # request 7 has 1 token: rows 0, 1 are below 3
    masked = mask_rows(torch.zeros(4, 6), hits)
    assert torch.isinf(masked).sum() == 4 and masked[2].isfinite().all() and masked[3].isfinite().all()


def test_stop_strings_stop_reason_and_include_stop_str(llm: LLM) -> None:
    full = llm.generate("w1 W2", GREEDY)[0].outputs[0].text
    stop = full.split()[2]
    out = llm.generate("w1 W2", SamplingParams(temperature=0, max_tokens=6, stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop and out.text == full[: full.index(stop)]
    kept = SamplingParams(temperature=0, max_tokens=6, stop=[stop], include_stop_str_in_output=True)
    out = llm.generate("w1 W2", kept)[0].outputs[0]
    assert out.text == full[: full.index(stop) + len(stop)]


def test_skip_special_tokens(llm: LLM) -> None:
    forced = dict(temperature=0, max_tokens=3, ignore_eos=True, golden_token_ids=(5, 2, 6))
    shown = llm.generate("w1", SamplingParams(**forced, skip_special_tokens=False))[0].outputs[0].text
    hidden = llm.generate("w1", SamplingParams(**forced))[0].outputs[0].text
    assert "<pad>" in shown and "<pad>" not in hidden


def test_logprob_entries_are_vllms(llm: LLM) -> None:
    out = llm.generate("w1 W2", SamplingParams(temperature=0, max_tokens=2, logprobs=2, prompt_logprobs=1))[0]
    c = out.outputs[0]
    first = c.logprobs[0][c.token_ids[0]]
    assert isinstance(first, Logprob) and first.rank == 1 and first.decoded_token  # greedy: the top token
    assert out.prompt_logprobs[0] is None and all(p is not None for p in out.prompt_logprobs[1:])
    plain = llm.generate("w1 W2", SamplingParams(temperature=0, max_tokens=2))[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None
