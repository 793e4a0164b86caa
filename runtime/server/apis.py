"""The three HTTP protocols the server speaks, each a table of what differs between them: the recipe's
request and response classes, the fields checked for type, where the first event keeps the response's id
and creation time, and the error shape. Everything else (engine, streaming, errors) is shared."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import deepseek_recipe as dr

Generator = dr.ChatCompletionChunkGenerator | dr.ResponsesChunkGenerator | dr.MessagesChunkGenerator
Event = dr.ChatCompletionChunk | dr.ResponsesStreamEvent | dr.MessagesStreamEvent
Response = dr.ChatCompletionResponse | dr.ResponsesResponse | dr.MessagesResponse
# (converted request, response id, model name) -> the recipe generator a StreamProcessor consumes
GeneratorFactory = Callable[[dr.ConversationRequest, str, str], Generator]


@dataclass(frozen=True)
class Api:
    """One protocol endpoint."""

    name: str  # the metrics label
    path: str
    id_prefix: str
    # The recipe's type errors do not name the field ("invalid type: string, expected f32"); these
    # fields are checked first so the error names them.
    scalars: dict[str, tuple[type, ...]]
    # body -> converted request and its generator factory; raises the recipe's ConversionError/ValueError
    open: Callable[[bytes, dr.ConversionOptions], tuple[dr.ConversationRequest, GeneratorFactory]]
    response: type[Response]
    head: Callable[[dict[str, Any]], tuple[str, int]]  # first event's JSON -> (id, created)
    error_body: Callable[[dict[str, Any]], dict[str, Any]]  # the OpenAI error object -> this protocol's
    # the OpenAI error object -> the server-sent event that ends a stream which failed after it began
    sse_error: Callable[[dict[str, Any]], str]


_SAMPLING: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "top_p": (int, float),
    "stream": (bool,),
    "model": (str,),
}


def _open_chat(body: bytes, options: dr.ConversionOptions) -> tuple[dr.ConversationRequest, GeneratorFactory]:
    return dr.ChatCompletionRequest(body).convert(options), dr.ChatCompletionRequest.chunk_generator


def _open_responses(
    body: bytes, options: dr.ConversionOptions
) -> tuple[dr.ConversationRequest, GeneratorFactory]:
    req = dr.ResponsesRequest(body)
    # read before convert consumes the request: the response object reports them
    echo, tool_map = req.echo(), req.namespace_tool_map(options)
    conv = req.convert(options)

    def generator(conv: dr.ConversationRequest, rid: str, model: str) -> Generator:
        gen = dr.ResponsesRequest.chunk_generator(conv, rid, model)
        return gen.with_echo(echo).with_namespace_tool_map(tool_map)

    return conv, generator


def _open_messages(
    body: bytes, options: dr.ConversionOptions
) -> tuple[dr.ConversationRequest, GeneratorFactory]:
    return dr.MessagesRequest(body).convert(options), dr.MessagesRequest.chunk_generator


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


def _anthropic_error(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's error shape; the recipe reports every protocol's errors in OpenAI's. Anthropic calls
    a server-side failure "api_error"."""
    err = body["error"]
    kind = "api_error" if err["type"] == "server_error" else err["type"]
    return {"type": "error", "error": {"type": kind, "message": err["message"]}}


def _chat_sse_error(body: dict[str, Any]) -> str:
    # the openai client raises APIError for any stream data holding an "error" key
    return f"data: {json.dumps(body)}\n\n"


def _responses_sse_error(body: dict[str, Any]) -> str:
    # the Responses "error" event (type, code, message, param), with the error object as well so that
    # clients which look for "error" (the openai client) raise it
    err = body["error"]
    event = {"type": "error", "code": err["code"], "message": err["message"], "param": err["param"], **body}
    return f"event: error\ndata: {json.dumps(event)}\n\n"


def _messages_sse_error(body: dict[str, Any]) -> str:
    return f"event: error\ndata: {json.dumps(_anthropic_error(body))}\n\n"


CHAT = Api(
    name="chat",
    path="/v1/chat/completions",
    id_prefix="chatcmpl-",
    scalars={
        **_SAMPLING,
        "max_tokens": (int,),
        "max_completion_tokens": (int,),
        "seed": (int,),
        "logprobs": (bool,),
        "top_logprobs": (int,),
        "n": (int,),
        "messages": (list,),
        "stop": (str, list),
        "tools": (list,),
        "tool_choice": (str, dict),
        "stream_options": (dict,),
    },
    open=_open_chat,
    response=dr.ChatCompletionResponse,
    head=lambda h: (h["id"], h["created"]),
    error_body=_same,
    sse_error=_chat_sse_error,
)

RESPONSES = Api(
    name="responses",
    path="/v1/responses",
    id_prefix="resp_",
    scalars={
        **_SAMPLING,
        "max_output_tokens": (int,),
        "top_logprobs": (int,),
        "input": (str, list),
        "instructions": (str,),
    },
    open=_open_responses,
    response=dr.ResponsesResponse,
    head=lambda h: (h["response"]["id"], h["response"]["created_at"]),
    error_body=_same,
    sse_error=_responses_sse_error,
)

MESSAGES = Api(
    name="messages",
    path="/v1/messages",
    id_prefix="msg_",
    scalars={
        **_SAMPLING,
        "max_tokens": (int,),
        "top_k": (int,),
        "messages": (list,),
        "system": (str, list),
        "stop_sequences": (list,),
        "tools": (list,),
    },
    open=_open_messages,
    response=dr.MessagesResponse,
    # a Messages object has no creation time; the response builder still takes one
    head=lambda h: (h["message"]["id"], int(time.time())),
    error_body=_anthropic_error,
    sse_error=_messages_sse_error,
)

APIS = (CHAT, RESPONSES, MESSAGES)
