"""A chat conversation rendered to prompt token ids exactly as /v1/chat/completions renders it (the same
conversion and encoding code, protocol.py), for `LLM.chat`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import deepseek_recipe as dr
from tokenizers import Tokenizer

from dsgraph.runtime.server.apis import CHAT
from dsgraph.runtime.server.protocol import ApiError, conversion_options, convert, encode_prompt

# The recipe accepts exactly the served model name; the offline API has none of its own.
_MODEL = "dsgraph-offline"


def render_chat(
    recipe_tok: dr.Tokenizer,
    engine_tok: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    thinking: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Prompt ids of a chat request body {"messages": messages, "tools": tools}; ValueError naming the
    problem (the server's 400 message) for a malformed conversation."""
    body: dict[str, Any] = {"model": _MODEL, "messages": list(messages)}
    if tools:
        body["tools"] = list(tools)
    try:
        conv, _, _ = convert(CHAT, body, conversion_options(_MODEL, thinking))
        ids = encode_prompt(conv, recipe_tok, engine_tok)
    except ApiError as exc:
        raise ValueError(f"messages: {exc}") from exc
    if not ids:
        raise ValueError("messages: the rendered prompt is empty")
    return ids
