"""`dsgraph serve` on a tiny checkpoint with DeepSeek's real tokenizer, its outputs forced through the
server's test hook (FORCED_FIELD -> SamplingParams.golden_token_ids): reasoning and DSML tool calls as
the model would write them, parsed by the recipe into `reasoning_content` and `tool_calls`; stop
sequences met at a known place; one request failing inside the engine (FAULT_FIELD) while others go on."""

from __future__ import annotations

import json

import pytest

from dsgraph.models.deepseek_v41.tiny import make_tiny
from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import FAULT_FIELD, FORCED_FIELD, create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from tests.e2e.serve_util import held_pages, serving, wait_idle

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
MODEL = "tiny-deepseek"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
# The model's side of the V4.1 format as the recipe's encoder renders an assistant turn (thinking on:
# the prompt ends in "<think>"): reasoning, "</think>", then the answer or a DSML block, then EOS.
REASONING, ANSWER = "The user asks about the weather.", "It is sunny in Paris."
DSML_CALL = (
    '\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n'
    '<｜DSML｜ parameter name="city" string="true">Paris</｜DSML｜ parameter>\n'
    "</｜DSML｜ invoke>\n</｜DSML｜ calls>"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = make_tiny(tmp_path_factory.mktemp("tiny_deepseek"), seed=0, tokenizer="deepseek")
    engine = Engine(root, EngineConfig.from_flat(max_model_len=1024, max_num_seqs=4))
    tok = recipe_tokenizer(root)
    app = create_app(engine, MODEL, tok, thinking=True, allow_forced_outputs=True, allow_fault_injection=True)

    def forced(text: str) -> list[int]:  # the model's output tokens, ending in EOS
        return [*tok.encode(text), engine.cfg.eos_token_id]

    with serving(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)
        client.anthropic = anthropic.Anthropic(base_url=url, api_key="-", max_retries=0)
        client.state = app.state.server
        yield client, forced


def _create(client, ids: list[int], **kw):  # type: ignore[no-untyped-def]
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=len(ids) + 4, extra_body={FORCED_FIELD: ids}, **kw
    )


def test_forced_reasoning_is_separated_from_the_answer(server) -> None:  # type: ignore[no-untyped-def]
    client, forced = server
    ids = forced(f"{REASONING}</think>{ANSWER}")
    out = _create(client, ids)
    msg = out.choices[0].message
    assert msg.content == ANSWER and msg.reasoning_content == REASONING
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == len(ids)

    chunks = list(_create(client, ids, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ANSWER
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == REASONING
    assert not any("think>" in (d.content or "") for d in deltas)


# The server refuses every request with tools: the recipe attaches a "tool_call" output constraint to
# tool_choice "auto" and protocol.sampling_params rejects all constraints. Treating that kind as advisory
# (the recipe's parser still extracts the calls) makes this test pass as written (checked by hand).
def test_forced_dsml_tool_call_is_parsed(server) -> None:  # type: ignore[no-untyped-def]
    client, forced = server
    ids = forced(f"{REASONING}</think>{DSML_CALL}")
    out = _create(client, ids, tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert choice.message.reasoning_content == REASONING
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    chunks = list(_create(client, ids, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    for d in deltas:  # no raw markup ever leaks into text
        for text in (d.content, getattr(d, "reasoning_content", None)):
            assert text is None or ("DSML" not in text and "<｜" not in text and "</think>" not in text), d
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert {tc.index for tc in calls} == {0}
    assert "".join(tc.function.name or "" for tc in calls) == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]


def test_forced_ids_outside_the_vocabulary_are_a_400(server) -> None:  # type: ignore[no-untyped-def]
    client, _ = server
    with pytest.raises(openai.BadRequestError, match=r"golden_token_ids\[1\]: 129280"):
        _create(client, [5, 129280])


STOP_TEXT = f"{REASONING}</think>The answer is 42. END of the answer."


def test_openai_stop_sequence_ends_the_answer_before_it(server) -> None:  # type: ignore[no-untyped-def]
    client, forced = server
    ids = forced(STOP_TEXT)
    out = _create(client, ids, stop=["END"])
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == "The answer is 42. "
    assert choice.message.reasoning_content == REASONING
    # generation ended at the token completing "END", well before the forced EOS
    assert out.usage.completion_tokens < len(ids) - 3

    chunks = list(_create(client, ids, stop=["END"], stream=True))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == "The answer is 42. " and not any("END" in d for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]


def test_anthropic_stop_sequences_report_the_sequence_met(server) -> None:  # type: ignore[no-untyped-def]
    client, forced = server
    ids = forced(STOP_TEXT)
    kw = dict(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=len(ids) + 4,
        stop_sequences=["NEVER", "END"],
        extra_body={FORCED_FIELD: ids},
    )
    out = client.anthropic.messages.create(**kw)
    text = "".join(block.text for block in out.content if block.type == "text")
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == "END"
    assert text == "The answer is 42. " and out.usage.output_tokens < len(ids) - 3

    events = list(client.anthropic.messages.create(**kw, stream=True))
    streamed = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert (
        streamed == text and delta.delta.stop_reason == "stop_sequence" and delta.delta.stop_sequence == "END"
    )


def _faulty(ids: list[int], after: int) -> dict:  # type: ignore[type-arg]
    return {FORCED_FIELD: ids, FAULT_FIELD: after}


def test_engine_failure_of_one_request_is_a_5xx_for_it_alone(server) -> None:  # type: ignore[no-untyped-def]
    client, forced = server
    ids = forced(f"{REASONING}</think>{ANSWER}")
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=len(ids) + 4)
    # before the first token: an error status, streaming or not
    with pytest.raises(openai.InternalServerError, match="fault injected") as err:
        client.chat.completions.create(**kw, extra_body=_faulty(ids, 0))
    assert err.value.status_code == 500 and err.value.body["type"] == "server_error"
    with pytest.raises(openai.InternalServerError, match="fault injected"):
        client.chat.completions.create(**kw, stream=True, extra_body=_faulty(ids, 0))
    with pytest.raises(anthropic.InternalServerError, match="fault injected") as aerr:
        client.anthropic.messages.create(**kw, extra_body=_faulty(ids, 0))
    assert aerr.value.body["error"]["type"] == "api_error"

    # after the stream began: the stream ends in the protocol's error event
    got: list[object] = []
    with pytest.raises(openai.APIError, match="fault injected"):
        got.extend(client.chat.completions.create(**kw, stream=True, extra_body=_faulty(ids, 3)))
    assert got  # the events before the failure arrived
    with pytest.raises(openai.APIError, match="fault injected"):
        list(
            client.responses.create(
                model=MODEL,
                input="Hi",
                max_output_tokens=len(ids) + 4,
                stream=True,
                extra_body=_faulty(ids, 3),
            )
        )
    with pytest.raises(anthropic.APIError, match="fault injected"):
        list(client.anthropic.messages.create(**kw, stream=True, extra_body=_faulty(ids, 3)))

    wait_idle(client.state)
    assert set(held_pages(client.state.loop.engine).values()) == {0}
    out = _create(client, ids)
    assert out.choices[0].message.content == ANSWER and out.choices[0].finish_reason == "stop"
