"""Structured output through the server (tiny random checkpoint, DeepSeek's tokenizer): OpenAI
`response_format` (json_schema strict, json_object) and Responses `text.format` give JSON that validates;
`tool_choice` required / a named function and Anthropic `any` give tool calls (OpenAI `tool_calls`,
streamed or not, and Anthropic `tool_use` blocks) with arguments valid under the tool's schema; a
schema XGrammar cannot compile is a 400 naming the field and the server goes on serving; a repeated
schema compiles once."""

from __future__ import annotations

import json

import jsonschema
import pytest

from dsgraph.models.deepseek_v41.tiny import make_tiny
from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from tests.e2e.serve_util import serving

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
MODEL = "tiny-deepseek"
MESSAGES = [{"role": "user", "content": "Answer in json."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "parameters": {**SCHEMA, "required": ["city"]}}},
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = make_tiny(tmp_path_factory.mktemp("tiny_server_structured"), seed=0, tokenizer="deepseek")
    engine = Engine(root, EngineConfig.from_flat(max_model_len=1024, max_num_seqs=4, speculative="off"))
    app = create_app(engine, MODEL, recipe_tokenizer(root))
    with serving(app) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)
        c.anthropic = anthropic.Anthropic(base_url=url, api_key="-", max_retries=0)
        c.engine = engine
        yield c


def _chat(client, **kw):  # type: ignore[no-untyped-def]
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, **{"max_tokens": 64, "temperature": 0, **kw}
    )


@pytest.mark.slow
def test_json_schema_and_json_object(client) -> None:  # type: ignore[no-untyped-def]
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}
    before = client.engine.structured.cache.compiles if client.engine.structured._cache else 0
    for _ in range(2):
        out = _chat(client, response_format=fmt)
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    assert client.engine.structured.cache.compiles - before <= 1  # the second request hit the cache
    out = _chat(client, response_format={"type": "json_object"}, max_tokens=16)
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    else:  # cut by max_tokens: still the start of an object
        assert out.choices[0].message.content.lstrip().startswith("{")


@pytest.mark.slow
def test_responses_text_format(client) -> None:  # type: ignore[no-untyped-def]
    fmt = {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA, "strict": True}}
    out = client.responses.create(
        model=MODEL, input="Answer in json.", text=fmt, max_output_tokens=64, temperature=0
    )
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), SCHEMA)


def _valid_call(name: str, args: dict) -> None:  # type: ignore[type-arg]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert name in schemas, name
    jsonschema.validate(args, schemas[name])


@pytest.mark.slow
def test_generated_tool_calls_come_back_as_tool_calls(client) -> None:  # type: ignore[no-untyped-def]
    """The random model writes the DSML markers from byte-level token pieces under the grammar; each
    call still comes back as an OpenAI tool call whose arguments validate under its tool's schema."""
    sampled = {"temperature": 0}  # greedy here; the Anthropic case below samples (seeded)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        # one call: the random model would otherwise go on with more calls up to max_tokens
        out = _chat(
            client, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=200, **sampled
        )
        msg = out.choices[0].message
        assert out.choices[0].finish_reason == "tool_calls" and msg.tool_calls, msg
        for call in msg.tool_calls:
            _valid_call(call.function.name, json.loads(call.function.arguments))
        if isinstance(choice, dict):
            assert {c.function.name for c in msg.tool_calls} == {"get_weather"}


@pytest.mark.slow
def test_generated_tool_calls_come_back_as_tool_use_blocks(client) -> None:  # type: ignore[no-untyped-def]
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    out = client.anthropic.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=MESSAGES,
        tools=tools,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"seed": 2, "temperature": 1.0},
    )
    uses = [b for b in out.content if b.type == "tool_use"]
    assert out.stop_reason == "tool_use" and uses, out
    for block in uses:
        _valid_call(block.name, block.input)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            names[d.index] = names.get(d.index, "") + (d.function.name or "")
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    assert names
    for i, name in names.items():
        _valid_call(name, json.loads(args[i]))


def test_tool_call_grammar_accepts_the_recipes_rendering(client) -> None:  # type: ignore[no-untyped-def]
    import deepseek_recipe as dr
    import xgrammar as xg

    from dsgraph.runtime.server.apis import CHAT
    from dsgraph.runtime.server.protocol import conversion_options
    from dsgraph.runtime.server.structured_format import structured_outputs

    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}
    conv = dr.ChatCompletionRequest(json.dumps(body)).convert(conversion_options(MODEL, False))
    compiled = client.engine.structured.cache.wait(structured_outputs(CHAT, body, conv))
    tok = client.engine.tokenizer
    call = (
        '<｜DSML｜ invoke name="get_weather">\n<｜DSML｜ parameter name="city" string="true">Rome'
        '</｜DSML｜ parameter>\n<｜DSML｜ parameter name="days" string="false">3</｜DSML｜ parameter>\n'
        "</｜DSML｜ invoke>\n</｜DSML｜ calls>"
    )
    for text, ok in (
        (call, True),
        (call.replace("Rome", "Oslo"), False),
        (call.replace("get_w", "w"), False),
    ):
        m = xg.GrammarMatcher(compiled)
        accepted = all(m.accept_token(t) for t in tok.encode(text, add_special_tokens=False).ids)
        assert accepted == ok and (not ok or m.accept_token(client.engine.cfg.eos_token_id)), text


def test_bad_constraints_are_400_and_the_server_goes_on(client) -> None:  # type: ignore[no-untyped-def]
    bad = {
        "type": "json_schema",
        "json_schema": {
            "name": "w",
            "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        },
    }
    with pytest.raises(openai.BadRequestError, match=r"(structured_outputs\.json|schema).*missing"):
        _chat(client, response_format=bad)
    with pytest.raises(openai.BadRequestError, match=r"structured_outputs\.regex"):
        _chat(client, extra_body={"structured_outputs": {"regex": "(unclosed"}})
    with pytest.raises(openai.BadRequestError, match=r"structured_outputs"):
        _chat(client, extra_body={"structured_outputs": {"regex": "a", "choice": ["b"]}})
    out = _chat(client, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert out.choices[0].message.content in ("yes", "no") and out.choices[0].finish_reason == "stop"
