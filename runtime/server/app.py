"""The ASGI app: POST /v1/chat/completions, /v1/responses, /v1/messages (each SSE or JSON; apis.py),
GET /v1/models, /health, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import deepseek_recipe as dr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.sampling_params import RequestError
from dsgraph.runtime.server.apis import APIS, Api, Event
from dsgraph.runtime.server.engine_loop import EngineDead, EngineLoop
from dsgraph.runtime.server.metrics import Metrics
from dsgraph.runtime.server.protocol import ApiError, Prepared, conversion_options, prepare
from dsgraph.runtime.server.structured_format import wait_grammar

# Test hooks, off by default (the fields are then ignored). With `create_app(..., allow_forced_outputs=True)`
# a request body may carry FORCED_FIELD, token ids the engine emits instead of sampling
# (SamplingParams.golden_token_ids), so tests can drive reasoning and tool-call markup through the recipe's
# parser. With `allow_fault_injection=True`, FAULT_FIELD (a token count) makes the engine fail that request
# once it has generated that many tokens (Engine.inject_fault), to test that a failure stays isolated.
FORCED_FIELD = "dsgraph_golden_token_ids"
FAULT_FIELD = "dsgraph_fail_after_tokens"
_FINISH = {"length": dr.InferenceFinishReason.Length, "stop": dr.InferenceFinishReason.Stop}


class ServerState:
    def __init__(
        self,
        engine: Engine,
        model_name: str,
        recipe_tok: dr.Tokenizer,
        thinking: bool,
        allow_forced_outputs: bool = False,
        allow_fault_injection: bool = False,
    ) -> None:
        self.allow_forced_outputs = allow_forced_outputs
        self.allow_fault_injection = allow_fault_injection
        self.loop = EngineLoop(engine)
        self.metrics = Metrics(self.loop)
        self.model_name, self.recipe_tok = model_name, recipe_tok
        self.options = conversion_options(model_name, thinking)
        self.max_model_len = engine.model.geo.max_model_len
        self.eos = engine.cfg.eos_token_id


@dataclass
class _Tracking:
    """One request's timing (for the latency histograms) and its prompt-cache hit."""

    start: float  # time.monotonic() when the request arrived
    last: float | None = None  # when its latest token arrived
    cached_tokens: int = 0

    def token(self, metrics: Metrics) -> None:
        now = time.monotonic()
        if self.last is None:
            metrics.time_to_first_token.observe(now - self.start)
        else:
            metrics.inter_token_latency.observe(now - self.last)
        self.last = now


def _chunk(event: TokenEvent, want_logprobs: bool, eos: int) -> dr.InferenceChunk:
    if event.token == eos and event.finished:
        return dr.InferenceChunk.text("", 1)  # counted as a completion token, never shown as text
    lps = [(event.logprob, event.top)] if want_logprobs else None
    return dr.InferenceChunk.tokens([event.token], lps)


async def _add(
    state: ServerState, prep: Prepared, fault_after: int | None
) -> tuple[int, asyncio.Queue[TokenEvent]]:
    try:
        await wait_grammar(state.loop.engine, prep.params)
        return await state.loop.add(prep.prompt_ids, prep.params, fault_after)
    except RequestError as exc:
        raise ApiError(400, str(exc), exc.field) from exc
    except EngineDead as exc:
        raise ApiError.internal(str(exc), status=503) from exc


def _internal(exc: Exception) -> ApiError:
    return ApiError.internal(f"internal error: {type(exc).__name__}: {exc}")


def _raise_failure(event: TokenEvent) -> None:
    if event.finish_reason == "error":
        raise ApiError.internal(event.error or "the engine failed this request")


async def _recipe_chunks(
    state: ServerState, api: Api, prep: Prepared, track: _Tracking, fault_after: int | None
) -> AsyncIterator[Event]:
    """Run the request; its engine events through the recipe's StreamProcessor. The first event is
    awaited before the recipe's first output, which reports the prompt-cache hit known only then. An
    engine failure raises ApiError 500; the request is aborted if the consumer leaves."""
    rid, events = await _add(state, prep, fault_after)
    state.metrics.prompt_tokens.inc(len(prep.prompt_ids))
    gen = prep.generator(prep.conv, f"{api.id_prefix}{uuid.uuid4().hex}", state.model_name)
    proc = dr.StreamProcessor(gen, prep.conv.parsing_options, state.recipe_tok)
    want_lp = prep.params.logprobs or prep.params.top_logprobs > 0
    finished = False
    try:
        event = await events.get()
        finished = event.finished
        track.cached_tokens = event.num_cached_tokens
        usage = dr.PromptUsage(
            prompt_tokens=len(prep.prompt_ids), prompt_cache_hit_tokens=track.cached_tokens
        )
        _raise_failure(event)  # before the first output: a failure before any token gets an error status
        for out in proc.push(dr.InferenceChunk.ready(prompt_usage=usage)):
            yield out
        while True:
            _raise_failure(event)
            if event.token >= 0:
                state.metrics.generated_tokens.inc()
                track.token(state.metrics)
                for out in proc.push(_chunk(event, want_lp, state.eos)):
                    yield out
            # the recipe ends the response itself at a stop sequence, possibly before the engine sees it
            if event.finished or proc.finished:
                break
            event = await events.get()
            finished = event.finished
        if event.finish_reason in _FINISH and not proc.finished:
            for out in proc.push(dr.InferenceChunk.finish(_FINISH[event.finish_reason])):
                yield out
        for out in proc.finish():
            yield out
    finally:
        if not finished:  # the consumer left, the engine failed it or the recipe stopped it early
            state.loop.abort(rid)
        if not proc.finished:
            proc.close()


async def _prepend(first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    yield first
    async for chunk in rest:
        yield chunk


async def _sse(api: Api, chunks: AsyncIterator[Event]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            name = api.response.sse_event_name(chunk)
            yield (f"event: {name}\n" if name else "") + f"data: {chunk.to_json()}\n\n"
    except ApiError as exc:  # the status line is sent already: the stream ends in the protocol's error event
        yield api.sse_error(exc.body)
        return
    except Exception as exc:  # a server bug, reported the same way
        yield api.sse_error(_internal(exc).body)
        return
    done = api.response.sse_done_data()
    if done is not None:
        yield f"data: {done}\n\n"


def _hook_field(body: bytes, field: str) -> object:
    """A test hook's field of a request body; None when absent."""
    try:
        values = json.loads(body)
    except ValueError:
        return None  # the recipe reports malformed JSON
    return values.get(field) if isinstance(values, dict) else None


def _forced_ids(body: bytes) -> tuple[int, ...]:
    """The test hook's token ids (FORCED_FIELD) of a request body; () when absent."""
    ids = _hook_field(body, FORCED_FIELD)
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError(400, f"{FORCED_FIELD}: {ids!r}, expected a list of token ids", FORCED_FIELD)
    return tuple(ids)


def _fault_after(body: bytes) -> int | None:
    after = _hook_field(body, FAULT_FIELD)
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise ApiError(400, f"{FAULT_FIELD}: {after!r}, expected an integer >= 0", FAULT_FIELD)
    return after


async def _serve(state: ServerState, api: Api, body: bytes, track: _Tracking) -> Response:
    engine_tok = state.loop.engine.tokenizer
    prep = prepare(api, body, state.options, state.recipe_tok, engine_tok, state.max_model_len)
    if state.allow_forced_outputs:
        prep = replace(prep, params=replace(prep.params, golden_token_ids=_forced_ids(body)))
    fault = _fault_after(body) if state.allow_fault_injection else None
    chunks = _recipe_chunks(state, api, prep, track, fault)
    # The first chunk comes before the status line: a request failing before its first token gets a
    # real error status, never a 200 stream.
    first = await anext(chunks)
    if prep.stream:
        return StreamingResponse(_sse(api, _prepend(first, chunks)), media_type="text/event-stream")
    rid_text, created = api.head(json.loads(first.to_json()))  # id and creation time of the response
    response = api.response(rid_text, state.model_name, created, len(prep.prompt_ids), track.cached_tokens)
    async for chunk in _prepend(first, chunks):
        response.accumulate(chunk)
    return Response(response.to_json(), media_type="application/json")


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read: nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, Response]) -> Response | None:
    """Run `work`; if the client leaves first, cancel it (its request is aborted) and return None."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
    finally:  # also when this handler is cancelled (server shutdown): the work must not outlive it
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None


def _route(app: FastAPI, state: ServerState, api: Api) -> None:
    async def handle(request: Request) -> Response:
        track = _Tracking(time.monotonic())
        try:
            resp = await _unless_disconnected(request, _serve(state, api, await request.body(), track))
        except ApiError as exc:
            resp = JSONResponse(api.error_body(exc.body), status_code=exc.status)
        except Exception as exc:  # a server bug: this request gets the protocol's error, the server goes on
            err = _internal(exc)
            resp = JSONResponse(api.error_body(err.body), status_code=err.status)
        # nginx's "client closed request": nobody reads it, the metrics count it
        resp = resp if resp is not None else Response(status_code=499)
        state.metrics.requests.labels(api.name, str(resp.status_code)).inc()
        return resp

    app.post(api.path, name=api.name)(handle)


def create_app(
    engine: Engine,
    model_name: str,
    recipe_tok: dr.Tokenizer,
    thinking: bool = False,
    allow_forced_outputs: bool = False,
    allow_fault_injection: bool = False,
) -> FastAPI:
    """The server app around one engine; `app.state.server` holds the engine loop and metrics.
    `allow_forced_outputs` / `allow_fault_injection` enable the FORCED_FIELD / FAULT_FIELD test hooks;
    never for a real server."""
    state = ServerState(engine, model_name, recipe_tok, thinking, allow_forced_outputs, allow_fault_injection)
    app = FastAPI(title="dsgraph")
    app.state.server = state

    for api in APIS:
        _route(app, state, api)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "dsgraph",
            "max_model_len": state.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        if state.loop.error is not None:
            return JSONResponse({"status": "error", "error": repr(state.loop.error)}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
