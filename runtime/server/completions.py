"""POST /v1/completions: OpenAI's text completions (what lm-evaluation-harness and many clients call), JSON
or server-sent events, with `echo`, `logprobs` (OpenAI's legacy shape: tokens, token_logprobs,
top_logprobs, text_offset), `n`, a list of prompts and vLLM's extra sampling fields. The prompt is used as
given (no chat template). Like vLLM, `echo` with `max_tokens` 0 scores the prompt alone."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from dsgraph.runtime.engine import TokenEvent
from dsgraph.runtime.sampling_params import RequestError, completion_seed
from dsgraph.runtime.server.completions_request import CompletionRequest, parse_completion
from dsgraph.runtime.server.engine_loop import EngineDead
from dsgraph.runtime.server.limits import parse_json, read_body
from dsgraph.runtime.server.protocol import ApiError
from dsgraph.runtime.server.request_log import Tracking, track_request
from dsgraph.runtime.server.streams import prepend

if TYPE_CHECKING:
    from dsgraph.runtime.server.app import ServerState

__all__ = ["add_completions"]

PATH = "/v1/completions"
_FLOOR = -9999.0  # JSON has no -inf: a token cut from the distribution reports this (DeepInfer's value)


@dataclass
class _Choice:
    index: int
    prompt_ids: list[int]
    rid: int = -1
    events: asyncio.Queue[TokenEvent] | None = None
    finished: bool = False
    tokens: list[int] = field(default_factory=list)
    cached: int = 0


def _lp(value: float | None) -> float | None:
    return None if value is None else max(float(value), _FLOOR)


class _Logprobs:
    """OpenAI's legacy logprobs object of one choice, built token by token."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.offset = tok, 0
        self.body: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }

    def add(self, token: int, logprob: float | None, top: Any) -> None:
        piece = self.tok.decode([token], skip_special_tokens=False)
        self.body["tokens"].append(piece)
        self.body["token_logprobs"].append(_lp(logprob))
        tops = (
            None if top is None else {self.tok.decode([t], skip_special_tokens=False): _lp(v) for t, v in top}
        )
        self.body["top_logprobs"].append(tops)
        self.body["text_offset"].append(self.offset)
        self.offset += len(piece)

    def add_prompt(self, ids: list[int], entries: Any) -> None:
        for pos, token in enumerate(ids):
            e = entries[pos] if entries is not None else None
            self.add(token, None if e is None else e.logprob, None if e is None else e.top)

    def take(self) -> dict[str, list[Any]]:
        body, self.body = self.body, {k: [] for k in self.body}
        return body


async def _start(state: ServerState, req: CompletionRequest) -> list[_Choice]:
    """Queue every (prompt, completion) as one engine request; n completions use derived seeds."""
    base = req.params.completion_seeds()[0]
    choices, n = [], req.params.n
    for i, ids in enumerate(req.prompts):
        for k in range(n):
            choice = _Choice(i * n + k, ids)
            params = replace(req.params, n=1, seed=completion_seed(base, k))
            try:
                choice.rid, choice.events = await state.loop.add(ids, params)
            except RequestError as exc:
                _abort(state, choices)
                raise ApiError(400, f"prompt[{i}]: {exc}", exc.field) from exc
            except EngineDead as exc:
                _abort(state, choices)
                raise ApiError.internal(str(exc), status=503) from exc
            choices.append(choice)
    return choices


def _abort(state: ServerState, choices: list[_Choice]) -> None:
    for c in choices:
        if not c.finished and c.rid >= 0:
            state.loop.abort(c.rid)


async def _merged(choices: list[_Choice]) -> AsyncIterator[tuple[_Choice, TokenEvent]]:
    """Every choice's events as they arrive, until all have finished."""
    merged: asyncio.Queue[tuple[_Choice, TokenEvent]] = asyncio.Queue()

    async def pump(c: _Choice) -> None:
        while True:
            event = await c.events.get()  # type: ignore[union-attr]
            await merged.put((c, event))
            if event.finished:
                return

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        left = len(choices)
        while left:
            c, event = await merged.get()
            if event.finish_reason == "error":
                raise ApiError.internal(event.error or "the engine failed this request")
            if event.finished:
                c.finished, left = True, left - 1
            yield c, event
    finally:
        for t in tasks:
            t.cancel()


@dataclass
class _Call:
    """One request in flight: what the response builders read."""

    state: ServerState
    req: CompletionRequest
    track: Tracking
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        out = {"id": self.id, "object": "text_completion", "created": self.created}
        out |= {"model": self.state.model_name, "choices": choices}
        return out | ({"usage": usage} if usage is not None else {})

    def usage(self, choices: list[_Choice]) -> dict[str, Any]:
        prompt = sum(len(ids) for ids in self.req.prompts)
        completion = 0 if self.req.drop_output else sum(len(c.tokens) for c in choices)
        cached = sum(c.cached for c in choices if c.index % self.req.params.n == 0)
        details = {"cached_tokens": cached}
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        } | {"prompt_tokens_details": details}


def _piece(call: _Call, c: _Choice, event: TokenEvent, lps: _Logprobs | None) -> dict[str, Any]:
    """A choice's delta for one event: its new text (and the prompt first, with echo)."""
    req, text = call.req, ""
    if not c.tokens and req.echo:
        prompt_text = req.texts[c.index // req.params.n]
        text = (
            prompt_text if prompt_text is not None else call.state.loop.engine.tokenizer.decode(c.prompt_ids)
        )
        if lps is not None:
            lps.add_prompt(c.prompt_ids, event.prompt_logprobs)
    if event.token >= 0:
        c.tokens.append(event.token)
        c.cached = event.num_cached_tokens
        call.state.metrics.generated_tokens.inc()
        call.track.observe(call.state.metrics)
        if not req.drop_output:
            text += event.text
            if lps is not None:
                lps.add(event.token, event.logprob, event.top if req.params.logprobs else None)
    finish = event.finish_reason if event.finished else None
    finish = "length" if finish and req.drop_output else finish
    body = None if lps is None else lps.take()
    return {"index": c.index, "text": text, "logprobs": body, "finish_reason": finish}


async def _whole(call: _Call, choices: list[_Choice]) -> Response:
    want = call.req.params.logprobs is not None
    lps = {c.index: _Logprobs(call.state.loop.engine.tokenizer) if want else None for c in choices}
    acc = {c.index: {"index": c.index, "text": "", "logprobs": None, "finish_reason": None} for c in choices}
    async for c, event in _merged(choices):
        piece = _piece(call, c, event, lps[c.index])
        out = acc[c.index]
        out["text"] += piece["text"]
        out["finish_reason"] = piece["finish_reason"] or out["finish_reason"]
        if piece["logprobs"] is not None:
            merged = out["logprobs"] or {k: [] for k in piece["logprobs"]}
            out["logprobs"] = {k: merged[k] + v for k, v in piece["logprobs"].items()}
    body = call.chunk([acc[c.index] for c in choices], call.usage(choices))
    return JSONResponse(body)


async def _sse(
    call: _Call,
    choices: list[_Choice],
    first: tuple[_Choice, TokenEvent],
    rest: AsyncIterator[tuple[_Choice, TokenEvent]],
) -> AsyncIterator[str]:
    want = call.req.params.logprobs is not None
    lps = {c.index: _Logprobs(call.state.loop.engine.tokenizer) if want else None for c in choices}
    try:
        async for c, event in prepend(first, rest):
            piece = _piece(call, c, event, lps[c.index])
            if piece["text"] or piece["finish_reason"] or piece["logprobs"]:
                yield f"data: {json.dumps(call.chunk([piece]))}\n\n"
        if call.req.include_usage:
            yield f"data: {json.dumps(call.chunk([], call.usage(choices)))}\n\n"
        yield "data: [DONE]\n\n"
    except ApiError as exc:  # the status line is sent already: the stream ends in an error object
        yield f"data: {json.dumps(exc.body)}\n\n"
    finally:
        _abort(call.state, choices)


async def _serve(state: ServerState, raw: bytes, track: Tracking) -> Response:
    engine = state.loop.engine
    body = parse_json(raw, state.limits)
    model = _model(body)
    if model is not None and model != state.model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", "model", code="model_not_found")
    req = parse_completion(body, engine.tokenizer, state.max_model_len, engine.cfg.text.vocab_size)
    track.prompt_tokens = sum(len(p) for p in req.prompts)
    state.metrics.prompt_tokens.inc(track.prompt_tokens)
    call = _Call(state, req, track)
    choices = await _start(state, req)
    if not req.stream:
        try:
            return await _whole(call, choices)
        finally:
            _abort(state, choices)
    # the status line waits for the first event: a request that fails before its first token (a
    # prefill/decode handoff refused) gets an error status, which a router retries elsewhere
    merged = _merged(choices)
    try:
        first = await anext(merged)
    except BaseException:
        _abort(state, choices)
        raise
    return StreamingResponse(_sse(call, choices, first, merged), media_type="text/event-stream")


def _model(body: Any) -> str | None:
    return body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else None


def add_completions(app: FastAPI, state: ServerState) -> None:
    """Register POST /v1/completions on the server app."""
    from dsgraph.runtime.server import app as server_app  # the shared disconnect and error handling

    async def completions(request: Request) -> Response:
        track = track_request(request.scope)
        try:
            raw = await read_body(request.stream(), request.headers.get("content-length"), state.limits)
            work = _serve(state, raw, track)
            resp = await server_app._unless_disconnected(request, work)
        except ClientDisconnect:  # left while sending its body: counted as 499 below
            resp = None
        except ApiError as exc:
            resp = JSONResponse(exc.body, status_code=exc.status)
        except Exception as exc:  # a server bug: this request gets an error, the server goes on
            err = server_app._internal(exc)
            resp = JSONResponse(err.body, status_code=err.status)
        resp = resp if resp is not None else Response(status_code=499)
        state.metrics.requests.labels("completions", str(resp.status_code)).inc()
        return resp

    app.post(PATH, name="completions")(completions)
