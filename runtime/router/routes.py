"""The endpoints a router forwards, and what it reads from a request body: whether it streams, an
estimate of its prompt's tokens and the text prefix that prefix affinity hashes."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsgraph.runtime.server.apis import CHAT, MESSAGES, RESPONSES, Api


@dataclass(frozen=True)
class Route:
    name: str
    path: str
    error_body: Callable[[dict[str, Any]], dict[str, Any]]  # OpenAI's error object -> this protocol's
    sse_error: Callable[[dict[str, Any]], str]  # the event that ends a stream failed after it began
    ends: tuple[bytes, ...]  # what a stream that ended properly sends last


def _route(api: Api, ends: tuple[bytes, ...]) -> Route:
    return Route(api.name, api.path, api.error_body, api.sse_error, ends)


ROUTES = (
    _route(CHAT, (b"data: [DONE]",)),
    Route("completions", "/v1/completions", CHAT.error_body, CHAT.sse_error, (b"data: [DONE]",)),
    _route(MESSAGES, (b"event: message_stop",)),
    _route(
        RESPONSES, (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")
    ),
)
# an engine that failed a request after its stream began ends it with one of these itself
ERROR_STARTS = (b'data: {"error"', b"event: error")


@dataclass(frozen=True)
class Summary:
    stream: bool
    tokens: int  # estimated prompt tokens
    prefix: str  # the start of the prompt text (prefix affinity's key)


def _texts(value: Any) -> list[str]:
    """Every string under a messages/prompt/input value (content parts included), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, dict):
        return [t for k in ("content", "text", "system", "input") if k in value for t in _texts(value[k])]
    return []


def summarize(body: bytes, chars_per_token: float) -> Summary:
    """What the policies need from a body. A body that is not a JSON object is still forwarded: the
    engine answers it with the error that names the field."""
    try:
        values = json.loads(body)
    except ValueError:
        return Summary(False, 1, "")
    if not isinstance(values, dict):
        return Summary(False, 1, "")
    parts = _texts(values.get("system")) + _texts(values.get("messages")) + _texts(values.get("input"))
    prompt = values.get("prompt")
    ids = _token_ids(prompt)
    parts += [] if ids else _texts(prompt)
    text = "\n".join(parts)
    tokens = max(1, int(len(text) / chars_per_token) + ids)
    return Summary(values.get("stream") is True, tokens, text)


def _token_ids(prompt: Any) -> int:
    """Tokens of a /v1/completions prompt given as ids (a list of ints, or of such lists)."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return sum(_token_ids(p) for p in prompt)
    return 0
