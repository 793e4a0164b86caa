"""`dsgraph serve` in-process on a loopback port with the tiny random model, driven by the real `openai` and
`anthropic` clients and raw httpx: chat completions, Responses and Messages (JSON and SSE) with usage,
models/health/metrics, bad inputs, disconnect."""

from __future__ import annotations

import json
import time

import httpx2 as httpx  # the HTTP client the `openai` package ships on
import pytest

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import held_pages, serving, wait_idle

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
MODEL = "tiny-test"
MAX_LEN = 128
# The tiny tokenizer splits on whitespace only, so the rendered prompt
# "<bos><User>W3 W5 W7<Assistant></think>" is exactly 3 words: 3 prompt tokens.
MESSAGES = [{"role": "user", "content": "W3 W5 W7"}]


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=MAX_LEN, max_num_seqs=4))
    app = create_app(engine, MODEL, recipe_tokenizer(root))
    with serving(app) as url:
        yield url, app.state.server


def _client(url: str):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _check_usage(usage, finish: str, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
    assert usage.prompt_tokens == 3
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if finish == "length":
        assert usage.completion_tokens == max_tokens
    else:
        assert finish == "stop" and 1 <= usage.completion_tokens <= max_tokens


def test_openai_client_non_streaming_and_streaming_agree(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    client = _client(url)
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, seed=3)
    out = client.chat.completions.create(**kw, logprobs=True)
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.model == MODEL
    assert choice.message.role == "assistant" and choice.message.content
    _check_usage(out.usage, choice.finish_reason, 6)
    # one logprob per shown token; an EOS ending is counted in usage but not shown
    shown = len(choice.logprobs.content)
    assert shown == out.usage.completion_tokens - (choice.finish_reason == "stop")

    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    assert text == choice.message.content and finish == [choice.finish_reason]
    assert len(usage) == 1 and usage[0].completion_tokens == out.usage.completion_tokens
    _check_usage(usage[0], finish[0], 6)


def test_models_health_metrics(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    assert [m.id for m in _client(url).models.list().data] == [MODEL]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    _client(url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    text = httpx.get(f"{url}/metrics").text
    metrics = {
        line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"
    }
    assert metrics['dsgraph_requests_total{endpoint="chat",status="200"}'] >= 1
    assert metrics["dsgraph_prompt_tokens_total"] >= 3
    assert metrics["dsgraph_generation_tokens_total"] >= 1
    assert metrics["dsgraph_num_requests_running"] == 0
    assert metrics["dsgraph_num_requests_waiting"] == 0
    assert 0 <= metrics["dsgraph_prefix_cache_hit_rate"] <= 1
    assert metrics["dsgraph_time_to_first_token_seconds_count"] >= 1
    assert 0 <= metrics["dsgraph_kv_cache_usage"] <= 1 and metrics["dsgraph_state_slots_total"] == 4


def _body(**kw) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **kw}


def _tool(name: str | None = "f", parameters: object = None) -> dict:  # type: ignore[type-arg]
    function = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


BAD = [
    ("malformed json", b'{"model": ', 400, "JSON"),
    ("missing messages", {"model": MODEL}, 400, "messages"),
    ("messages not a list", _body(messages="hi"), 400, "messages"),
    ("temperature a string", _body(temperature="hot"), 400, "temperature"),
    ("max_tokens a float", _body(max_tokens=2.5), 400, "max_tokens"),
    ("temperature out of range", _body(temperature=-1), 400, "temperature"),
    ("top_p out of range", _body(top_p=7), 400, "top_p"),
    ("unknown model", _body(model="gpt-4"), 400, "gpt-4"),
    ("prompt over the context", _body(messages=[{"role": "user", "content": "W1 " * 200}]), 400, "context"),
    ("max_tokens over the context", _body(max_tokens=10_000), 400, "context"),
    (
        "json_schema",
        _body(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}),
        400,
        "spellable",  # the tiny word-level vocabulary has no token of JSON
    ),
    ("tool without a name", _body(tools=[_tool(name=None)]), 400, "missing field `name`"),
    ("tool with an empty name", _body(tools=[_tool(name="")]), 400, "tools[0].function.name"),
    ("tool name not a word", _body(tools=[_tool(name="get weather!")]), 400, "tools[0].function.name"),
    ("tool parameters a string", _body(tools=[_tool(parameters="city")]), 400, "schema for function 'f'"),
    (
        "tool parameters not an object schema",
        _body(tools=[_tool(parameters={"type": "string"})]),
        400,
        "object",
    ),
    ("tool names repeated", _body(tools=[_tool(), _tool()]), 400, "unique"),
    (
        "tools not a list",
        _body(tools={"name": "f"}),
        400,
        "tools: {'name': 'f'} has type dict, expected list",
    ),
    ("tool of an unknown type", _body(tools=[{"type": "search", "function": {"name": "f"}}]), 400, "search"),
]


@pytest.mark.parametrize("name,body,status,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_error_then_server_serves(server, name, body, status, needle) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        f"{url}/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle.lower() in error["message"].lower(), error
    assert error["type"] == "invalid_request_error"
    ok = _client(url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert ok.usage.prompt_tokens == 3


def test_streaming_disconnect_frees_the_request(server) -> None:  # type: ignore[no-untyped-def]
    url, state = server
    body = _body(max_tokens=MAX_LEN - 8, stream=True, temperature=0, seed=1)
    before = state.metrics.generated_tokens._value.get()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    wait_idle(state)
    assert set(held_pages(state.loop.engine).values()) == {0}  # its pages went back
    assert state.metrics.generated_tokens._value.get() - before < MAX_LEN - 8
    ok = _client(url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_openai_client_responses_non_streaming_and_streaming_agree(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    client = _client(url)
    kw = dict(model=MODEL, input="W3 W5 W7", max_output_tokens=6, temperature=0)
    out = client.responses.create(**kw)
    assert out.object == "response" and out.model == MODEL and out.id.startswith("resp_")
    assert out.output_text and out.output[0].role == "assistant"
    assert out.usage.input_tokens == 3
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    # "incomplete" only when the output limit cut the answer, which then used every token allowed
    if out.status == "incomplete":
        assert out.usage.output_tokens == 6
    else:
        assert out.status == "completed" and 1 <= out.usage.output_tokens <= 6

    events = list(client.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == out.output_text == final.output_text
    assert final.usage.input_tokens == 3 and final.usage.output_tokens == out.usage.output_tokens


def _anthropic(url: str):  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def test_anthropic_client_messages_non_streaming_and_streaming_agree(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    client = _anthropic(url)
    # this client release no longer takes `temperature`; the Messages body still does (greedy: both agree)
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=6, extra_body={"temperature": 0})
    out = client.messages.create(**kw)
    assert out.type == "message" and out.role == "assistant" and out.model == MODEL
    assert out.content[0].type == "text" and out.content[0].text
    assert out.usage.input_tokens == 3
    if out.stop_reason == "max_tokens":
        assert out.usage.output_tokens == 6
    else:
        assert out.stop_reason == "end_turn" and 1 <= out.usage.output_tokens <= 6

    events = list(client.messages.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert events[0].message.usage.input_tokens == 3
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    delta = [e for e in events if e.type == "message_delta"]
    assert text == out.content[0].text
    assert len(delta) == 1 and delta[0].delta.stop_reason == out.stop_reason
    assert delta[0].usage.output_tokens == out.usage.output_tokens


def test_responses_bad_input_gets_error_then_server_serves(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    r = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "W3", "temperature": "hot"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "temperature" in error["message"] and error["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="input or instructions"):
        _client(url).responses.create(model=MODEL, max_output_tokens=2)
    for tool, needle in (
        ({"type": "function"}, "missing field `name`"),
        (_tool(parameters="x")["function"], "schema"),
    ):
        r = httpx.post(
            f"{url}/v1/responses",
            json={"model": MODEL, "input": "W3", "tools": [{"type": "function", **tool}]},
        )
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert (
        _client(url).responses.create(model=MODEL, input="W3 W5 W7", max_output_tokens=2).usage.input_tokens
        == 3
    )


MESSAGES_BAD = [
    ("max_tokens a float", {"max_tokens": 2.5}, "max_tokens"),
    ("tool without a name", {"tools": [{"input_schema": {"type": "object"}}]}, "missing field `name`"),
    ("tool without a schema", {"tools": [{"name": "f"}]}, "schema for function 'f'"),
    ("tool schema not an object", {"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "object"),
]


@pytest.mark.parametrize("name,fields,needle", MESSAGES_BAD, ids=[b[0] for b in MESSAGES_BAD])
def test_messages_bad_input_gets_anthropic_error_then_server_serves(server, name, fields, needle) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **fields}
    r = httpx.post(f"{url}/v1/messages", json=body)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert needle in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="gpt-4"):
        _anthropic(url).messages.create(model="gpt-4", messages=MESSAGES, max_tokens=2)
    ok = _anthropic(url).messages.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert ok.usage.input_tokens == 3


def test_64_concurrent_streams_complete_and_free_every_page(server) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from dsgraph.models.deepseek_v41.step_io import ratios

    url, state = server
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    async def one(i: int) -> tuple[str, list[str], int]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"W{i % 50} W5 W7"}],
            max_tokens=4,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        (usage,) = [c.usage for c in chunks if c.usage]
        return text, finish, usage.completion_tokens

    async def all_of_them() -> list[tuple[str, list[str], int]]:
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(64))), timeout=60)

    results = asyncio.run(all_of_them())
    assert len(results) == 64
    for _, finish, completion in results:
        assert finish in (["length"], ["stop"]) and 1 <= completion <= 4
        assert finish == ["stop"] or completion == 4
    deadline = time.time() + 10
    while not (state.loop.idle and not state.loop.engine.has_unfinished):
        assert time.time() < deadline, "requests still in the engine after every stream ended"
        time.sleep(0.02)
    engine = state.loop.engine
    assert engine.live == {}
    for r in ratios(engine.model.plans):
        usage = engine.scheduler.page_usage(r)
        assert usage.used - usage.cached == 0, (r, usage)


def test_forced_outputs_hook_is_off_by_default(server) -> None:  # type: ignore[no-untyped-def]
    from dsgraph.runtime.server.app import FORCED_FIELD

    url, state = server
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0)
    plain = _client(url).chat.completions.create(**kw)
    ids = [4, 5, 6, 7]
    forced_text = state.loop.engine.tokenizer.decode(ids)
    assert plain.choices[0].message.content != forced_text  # else the check below could not fail
    hooked = _client(url).chat.completions.create(**kw, extra_body={FORCED_FIELD: ids})
    assert hooked.choices[0].message.content == plain.choices[0].message.content
