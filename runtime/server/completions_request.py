"""A /v1/completions request body (OpenAI's legacy text completions, with vLLM's extra sampling fields)
-> prompts as token ids and one SamplingParams; every error is a 400 naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.server.fields import UNSUPPORTED, check_unsupported
from dsgraph.runtime.server.protocol import ApiError

__all__ = ["CompletionRequest", "parse_completion"]

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint
# OpenAI fields that would change the output and have no counterpart yet: refused unless at their default
_UNSUPPORTED = {**UNSUPPORTED, "suffix": None}
# vLLM's extra fields, passed to SamplingParams as they are
_EXTRA = ("top_k", "min_p", "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens")
_EXTRA += ("include_stop_str_in_output",)


@dataclass(frozen=True)
class CompletionRequest:
    prompts: list[list[int]]
    texts: list[str | None]  # the prompt as text, where it was given as text (echo needs it either way)
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool
    drop_output: bool  # max_tokens 0 with echo: score the prompt only (one token runs, none is returned)


def _field(body: dict[str, Any], name: str, types: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        want = " or ".join(t.__name__ for t in types)
        raise ApiError(400, f"{name}: {value!r} has type {type(value).__name__}, expected {want}", name)
    return value


def _prompts(body: dict[str, Any], tok: Tokenizer) -> tuple[list[list[int]], list[str | None]]:
    raw = body.get("prompt")
    items = (
        [raw] if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int)) else raw
    )
    if not isinstance(items, list) or not items:
        raise ApiError(
            400, f"prompt: {raw!r}, expected a string, token ids or a non-empty list of them", "prompt"
        )
    ids, texts = [], []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids.append(tok.encode(item).ids)
            texts.append(item)
        elif isinstance(item, list) and item and all(type(t) is int for t in item):
            ids.append(list(item))
            texts.append(None)
        else:
            raise ApiError(
                400, f"prompt[{i}]: {item!r}, expected a string or a non-empty list of token ids", "prompt"
            )
    return ids, texts


def _sampling(body: dict[str, Any], max_tokens: int, echo: bool) -> SamplingParams:
    logprobs = _field(body, "logprobs", (int,), None)
    stop = _field(body, "stop", (str, list), [])
    extra = {name: body[name] for name in _EXTRA if body.get(name) is not None}
    try:
        return SamplingParams(
            n=_field(body, "n", (int,), 1),
            temperature=float(_field(body, "temperature", (int, float), 1.0)),
            top_p=float(_field(body, "top_p", (int, float), 1.0)),
            seed=_field(body, "seed", (int,), None),
            stop=stop,
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=logprobs if echo and logprobs is not None else None,
            **extra,
        )
    except TypeError as exc:
        raise ApiError(400, str(exc)) from exc


def parse_completion(body: Any, tok: Tokenizer, max_model_len: int, vocab_size: int) -> CompletionRequest:
    """A parsed request body (limits.parse_json) as a completion request; 400 naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    check_unsupported(body, _UNSUPPORTED)
    n = _field(body, "n", (int,), 1)
    if _field(body, "best_of", (int,), n) != n:
        raise ApiError(400, f"best_of: {body['best_of']!r} is not supported (only equal to n)", "best_of")
    prompts, texts = _prompts(body, tok)
    echo = bool(_field(body, "echo", (bool,), False))
    longest = max(len(p) for p in prompts)
    max_tokens = _field(body, "max_tokens", (int,), None)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    drop = max_tokens == 0 and echo
    if max_tokens < 1 and not drop:
        raise ApiError(400, f"max_tokens: {max_tokens} must be >= 1 (0 only with echo)", "max_tokens")
    if longest + max(max_tokens, 1) > max_model_len - 1:
        msg = f"max_tokens: {max_tokens} plus the prompt's {longest} tokens exceed {max_model_len - 1}"
        msg += f" (max_model_len {max_model_len} less one position)"
        raise ApiError(400, msg, "max_tokens")
    params = _sampling(body, max(max_tokens, 1), echo)
    try:
        params.validate(vocab_size)
    except RequestError as exc:
        raise ApiError(400, str(exc), exc.field) from exc
    options = _field(body, "stream_options", (dict,), {})
    stream = bool(_field(body, "stream", (bool,), False))
    return CompletionRequest(prompts, texts, params, stream, bool(options.get("include_usage")), echo, drop)
