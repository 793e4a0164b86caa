"""Every recipe error a request can get names the field (its path in the body, also as the error's
`param`), and the value where the recipe's message left it out; a value spelled the same in a field the
server validated already is not blamed; OpenAI fields the engine cannot honour are refused, not dropped."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dsgraph.runtime.server.apis import CHAT, MESSAGES, RESPONSES, Api
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.protocol import conversion_options, convert

M = "m"
MSGS = [{"role": "user", "content": "hi"}]
CASES: list[tuple[Api, dict[str, Any], str, str]] = [
    (CHAT, {"model": "other", "messages": MSGS}, "model", r"^model: 'other': The supported API model"),
    (CHAT, {"model": M, "messages": []}, "messages", r"^messages: \[\]: Empty input messages"),
    (
        CHAT,
        {"model": M, "messages": [{"content": "x"}]},
        "messages[0].role",
        r"required.*missing field `role`",
    ),
    (CHAT, {"model": M, "messages": [{"role": "user"}]}, "messages[0].content", r"required"),
    (
        CHAT,
        {"model": M, "messages": [{"role": "user", "content": 5}]},
        "messages[0].content",
        r": 5, expected a str",
    ),
    (
        CHAT,
        {"model": M, "messages": [{"role": "tool", "content": "x"}]},
        "messages[0].tool_call_id",
        "required",
    ),
    (CHAT, {"model": M, "messages": MSGS, "tools": [{"type": "function"}]}, "tools[0].function", "required"),
    (
        CHAT,
        {"model": M, "messages": MSGS, "tools": [{"type": "function", "function": {"parameters": {}}}]},
        "tools[0].function.name",
        "missing field `name`",
    ),
    (
        CHAT,
        {"model": M, "messages": MSGS, "tool_choice": "bogus"},
        "tool_choice",
        r"^tool_choice: 'bogus', expected",
    ),
    (
        CHAT,
        {
            "model": M,
            "messages": MSGS,
            "response_format": {"type": "json_schema", "json_schema": {"schema": 3}},
        },
        "response_format.json_schema.schema",
        r"Invalid json schema: 3",
    ),
    (
        CHAT,
        {"model": M, "messages": MSGS, "response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "required",
    ),
    (
        CHAT,
        {"model": M, "messages": MSGS, "presence_penalty": 0.5},
        "presence_penalty",
        r"0\.5 is not supported",
    ),
    (
        CHAT,
        {"model": M, "messages": MSGS, "frequency_penalty": -1},
        "frequency_penalty",
        r"-1 is not supported",
    ),
    (CHAT, {"model": M, "messages": MSGS, "logit_bias": {"5": 1}}, "logit_bias", r"not supported"),
    (
        CHAT,
        {"model": M, "messages": MSGS, "frequency_penalty": "x"},
        "frequency_penalty",
        r": x, expected a number",
    ),
    (
        RESPONSES,
        {"model": M, "input": "x", "tool_choice": "bogus"},
        "tool_choice",
        r"'bogus', expected one of",
    ),
    (
        RESPONSES,
        {"model": M, "input": [{"role": "bogus", "content": "x"}]},
        "input[0].role",
        r"bogus, expected one of",
    ),
    (
        MESSAGES,
        {"model": M, "max_tokens": 5, "messages": MSGS, "tools": [{"name": "x"}]},
        "tools[0].input_schema",
        r"Invalid schema for function 'x'",
    ),
    # 5 is also max_tokens' value: the server checked that field, so the recipe means the other one
    (
        MESSAGES,
        {"model": M, "max_tokens": 5, "messages": MSGS, "metadata": {"user_id": 5}},
        "metadata.user_id",
        r"^metadata\.user_id: 5, expected a string",
    ),
    (
        MESSAGES,
        {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages[0].content[0].text",
        "required",
    ),
]


@pytest.mark.parametrize(("api", "body", "param", "message"), CASES)
def test_recipe_errors_name_the_field(api: Api, body: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(ApiError) as info:
        convert(api, body, conversion_options(M, False))
    err = info.value
    assert err.status == 400 and err.body["error"]["param"] == param, err.body
    assert err.body["error"]["message"].startswith(param), err.body
    assert re.search(message, err.body["error"]["message"]), err.body


def test_default_penalties_are_accepted() -> None:
    body = {"model": M, "messages": MSGS, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}}
    convert(CHAT, body, conversion_options(M, False))
