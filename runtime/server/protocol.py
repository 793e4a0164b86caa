"""Requests of any protocol (apis.py) through `deepseek-recipe`: body -> ConversationRequest -> prompt ids
and SamplingParams; errors as ApiError holding the OpenAI `{"error": {...}}` object."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import deepseek_recipe as dr
from tokenizers import Tokenizer

from dsgraph.models.interface import tokenizer_path
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.server.apis import Api, GeneratorFactory
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.fields import (
    UNSUPPORTED_BY_API,
    Extras,
    check_bounds,
    check_unsupported,
    take_extras,
)
from dsgraph.runtime.server.recipe_errors import name_conversion_error, name_recipe_error
from dsgraph.runtime.server.structured_format import constrains_tool_calls, request_constraint
from dsgraph.runtime.structured.params import StructuredOutputsParams


@dataclass(frozen=True)
class Prepared:
    """A converted request: what the engine runs and what the response builder needs."""

    conv: dr.ConversationRequest
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    generator: GeneratorFactory
    # the recipe's parser gets the engine's text instead of token ids (see `prepare`)
    text_chunks: bool = False


def conversion_options(model_name: str, thinking: bool) -> dr.ConversionOptions:
    """Accept exactly the served model name; thinking mode as the server's default."""
    return dr.ConversionOptions(default_thinking_mode=thinking).with_model_versions_by_name(
        {model_name: dr.ModelVersion.DeepseekV41Flash}
    )


def _check_types(values: dict[str, Any], scalars: dict[str, tuple[type, ...]]) -> None:
    for key, types in scalars.items():
        value = values.get(key)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            raise ApiError(400, f"{key}: {value!r} has type {type(value).__name__}, expected {want}", key)


def convert(
    api: Api, values: Any, options: dr.ConversionOptions
) -> tuple[dr.ConversationRequest, GeneratorFactory, Extras]:
    """The recipe's conversion of a parsed body (limits.parse_json) after the server's own checks (types,
    ranges, required fields); the recipe's errors become 400s naming the field."""
    if not isinstance(values, dict):
        raise ApiError(400, f"request body: a JSON {type(values).__name__}, expected an object")
    _check_types(values, api.scalars)
    check_bounds(api.name, values)
    check_unsupported(values, UNSUPPORTED_BY_API.get(api.name, {}))
    body, extras = take_extras(api.name, values)
    try:
        conv, generator = api.open(json.dumps(body).encode(), options)
    except dr.ConversionError as exc:
        raise name_conversion_error(ApiError.from_conversion(exc), values) from exc
    except ValueError as exc:
        raise name_recipe_error(str(exc), values, tuple(api.scalars)) from exc
    return conv, generator, extras


def max_bytes_per_token(tok: Tokenizer) -> int | None:
    """An upper bound on the UTF-8 bytes one token covers (4 per character of its longest token), so a
    text of n bytes has at least n / bound tokens; None for a tokenizer that maps an unknown word of any
    length to one token."""
    if getattr(tok.model, "unk_token", None) is not None:
        return None
    return 4 * max(len(t) for t in tok.get_vocab(with_added_tokens=True))


def _check_text_fits(text: str, context: int, bytes_per_token: int | None) -> None:
    """400 for a rendered prompt surely longer than the context, before tokenizing it (which costs far
    more memory than the text)."""
    if bytes_per_token is None or len(text) * 4 <= context * bytes_per_token:
        return  # too short to tell by its characters
    size = len(text.encode())
    if size > context * bytes_per_token:
        raise ApiError(
            400,
            f"messages: the rendered prompt has {size} bytes, so at least {size // bytes_per_token} tokens; "
            f"the maximum context length is {context} tokens",
            "messages",
        )


PROBE_CHARS = 1 << 16  # a rendered prompt longer than this is tokenized in growing prefixes first
PREFIX_MARGIN = 16  # tokens a prefix cut may have over the whole text's tokens before the cut


def _cut(text: str, size: int) -> int:
    """Where to cut `text` near `size`: between a word and the whitespace after it, where the
    pre-tokenizers of the tokenizers the server loads end a pre-token (else at `size`)."""
    cut = text.rfind(" ", 0, size)
    while cut > 0 and text[cut - 1].isspace():
        cut -= 1
    return cut if cut > 0 else size


def check_prefix_fits(text: str, context: int, tok: Tokenizer) -> None:
    """400 for a long rendered prompt whose leading part alone has more than `context` tokens (plus the
    cut's margin), found by tokenizing prefixes of 4x growing length: a prompt far over the context never
    gets tokenized whole (tokenizing costs about 250 bytes of memory per character)."""
    size = PROBE_CHARS
    while context > 0 and size < len(text):
        cut = _cut(text, size)
        n = len(tok.encode_batch([text[:cut]], add_special_tokens=False)[0].ids)
        if n > context + PREFIX_MARGIN:
            raise ApiError(
                400,
                f"messages: the rendered prompt has more than {n - PREFIX_MARGIN} tokens (its first {cut} "
                f"of {len(text)} characters alone); the maximum context length is {context} tokens",
                "messages",
            )
        size *= 4


def encode_prompt(
    conv: dr.ConversationRequest,
    recipe_tok: dr.Tokenizer,
    engine_tok: Tokenizer,
    context: int = 0,
    bytes_per_token: int | None = None,
) -> list[int]:
    """Token ids of the rendered prompt; with `bytes_per_token` (max_bytes_per_token), a prompt surely
    longer than `context` tokens is refused before tokenizing.

    The recipe encodes with the checkpoint's tokenizer when it holds DeepSeek's special tokens. Test
    checkpoints (the tiny model's 256-word vocabulary) lack them, so there the recipe's rendered text is
    tokenized by the engine's tokenizer instead (special-token spellings become unknown-word ids).
    """
    enc = dr.DeepseekV41Encoding()
    text = enc.render_conversation(conv.conversation).prompt
    _check_text_fits(text, context, bytes_per_token)
    check_prefix_fits(text, context, engine_tok)
    try:
        return list(enc.with_tokenizer(recipe_tok).encode(conv.conversation))
    except RuntimeError as exc:
        if "not in the added vocabulary" not in str(exc):
            raise ApiError(400, f"prompt encoding failed: {exc}") from exc
    # encode_batch releases the GIL (encode holds it throughout): other threads, the event loop among
    # them, run while a long prompt is tokenized
    return list(engine_tok.encode_batch([text], add_special_tokens=False)[0].ids)


def sampling_params(
    conv: dr.ConversationRequest,
    extras: Extras,
    prompt_len: int,
    max_model_len: int,
    structured: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """SamplingParams from the recipe's inference options and the server's extras; max_tokens resolved
    against the context (the smaller of the recipe's and `max_completion_tokens` wins); `structured`: the
    output constraint (structured_format.py)."""
    opts = conv.inference_options
    # the engine needs one free position after the prompt, so its context is one shorter than max_model_len
    try:
        max_tokens = conv.resolve_max_tokens(prompt_len, max_model_len - 1)
    except dr.ConversionError as exc:
        raise ApiError.from_conversion(exc) from exc
    if extras.max_tokens is not None:
        _check_context(prompt_len, extras.max_tokens, max_model_len - 1)
        max_tokens = min(max_tokens, extras.max_tokens)
    top = opts.top_logprobs or 0
    return SamplingParams(
        temperature=1.0 if opts.temperature is None else float(opts.temperature),
        top_p=1.0 if opts.top_p is None else float(opts.top_p),
        max_tokens=max_tokens,
        stop=tuple(conv.parsing_options.stop_sequences),
        seed=extras.seed,
        logprobs=int(top) if opts.logprobs or top else None,
        structured_outputs=structured,
    )


def _check_context(prompt_len: int, max_tokens: int, context: int) -> None:
    if prompt_len + max_tokens > context:
        raise ApiError(
            400,
            f"max_completion_tokens: {max_tokens}, expected at most {max(context - prompt_len, 0)} "
            f"(the maximum context length is {context} tokens, the prompt {prompt_len})",
            "max_completion_tokens",
        )


def prepare(
    api: Api,
    values: Any,
    options: dr.ConversionOptions,
    recipe_tok: dr.Tokenizer,
    engine_tok: Tokenizer,
    max_model_len: int,
    bytes_per_token: int | None = None,
) -> Prepared:
    """A parsed body (limits.parse_json) -> what the engine runs. Runs on the preparation pool."""
    conv, generator, extras = convert(api, values, options)
    ids = encode_prompt(conv, recipe_tok, engine_tok, max_model_len, bytes_per_token)
    if not ids:
        raise ApiError(400, "messages: the rendered prompt is empty", "messages")
    structured = request_constraint(api, values, conv)
    params = sampling_params(conv, extras, len(ids), max_model_len, structured)
    # A tool-call grammar allows any spelling of its text in tokens, and a model under it may write the
    # DSML markers from byte-level pieces; the recipe's token-id parser then misses the end of a string
    # parameter, while its text parser does not. Such requests (without logprobs, which need the ids)
    # reach the parser as the engine's detokenized text, special tokens kept.
    text_chunks = params.logprobs is None and constrains_tool_calls(api, values, conv)
    if text_chunks:
        params = replace(params, skip_special_tokens=False)
    return Prepared(conv, ids, params, conv.stream, generator, text_chunks)


def recipe_tokenizer(model_dir: str | Path, vocab_size: int | None = None) -> dr.Tokenizer:
    """The recipe's tokenizer over the same `tokenizer.json` the engine loads (same fallback)."""
    path = tokenizer_path(model_dir, vocab_size)
    try:
        return dr.Tokenizer.from_file(str(path))
    except Exception as exc:  # the recipe raises plain exceptions for a malformed file
        raise ValueError(f"{path}: not a valid tokenizer.json: {exc}") from exc
