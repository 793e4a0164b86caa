"""The ASGI app: POST /v1/chat/completions, /v1/responses, /v1/messages (each SSE or JSON; apis.py),
GET /v1/models, /health, /metrics, and a router's /load and /admin/drain (admin.py). Bodies are read
within limits.py's bounds and prepared on a thread pool; lifecycle.py drains the server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import deepseek_recipe as dr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.sampling_params import RequestError
from dsgraph.runtime.server.access import install_access
from dsgraph.runtime.server.admin import add_admin
from dsgraph.runtime.server.apis import APIS, Api, Event
from dsgraph.runtime.server.completions import add_completions
from dsgraph.runtime.server.engine_loop import EngineDead, EngineLoop
from dsgraph.runtime.server.errors import ApiError, PublicError
from dsgraph.runtime.server.hooks import FAULT_FIELD, FORCED_FIELD, fault_after, forced_ids
from dsgraph.runtime.server.lifecycle import Drain
from dsgraph.runtime.server.limits import (
    TRIM_AFTER_BYTES,
    ServerLimits,
    parse_json,
    read_body,
    release_memory,
)
from dsgraph.runtime.server.metrics import Metrics
from dsgraph.runtime.server.protocol import Prepared, conversion_options, max_bytes_per_token, prepare
from dsgraph.runtime.server.request_log import Tracking, track_request
from dsgraph.runtime.server.streams import prepend
from dsgraph.runtime.server.structured_format import wait_grammar

__all__ = ["FAULT_FIELD", "FORCED_FIELD", "ServerState", "create_app"]
_FINISH = {"length": dr.InferenceFinishReason.Length, "stop": dr.InferenceFinishReason.Stop}
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the metrics count it


class ServerState:
    def __init__(
        self,
        engine: Engine,
        model_name: str,
        recipe_tok: dr.Tokenizer,
        thinking: bool,
        allow_forced_outputs: bool = False,
        allow_fault_injection: bool = False,
        limits: ServerLimits | None = None,
        loop: EngineLoop | None = None,
    ) -> None:
        self.allow_forced_outputs = allow_forced_outputs
        self.allow_fault_injection = allow_fault_injection
        self.loop = loop if loop is not None else EngineLoop(engine)
        self.metrics = Metrics(self.loop)
        self.model_name, self.recipe_tok = model_name, recipe_tok
        self.options = conversion_options(model_name, thinking)
        self.max_model_len = engine.model.geo.max_model_len
        self.eos = engine.cfg.eos_token_id
        self.limits = limits = limits or ServerLimits()
        self.bytes_per_token = max_bytes_per_token(engine.tokenizer)
        # parsing, rendering and tokenizing run here, so a large request never holds up the event loop
        self.pool = ThreadPoolExecutor(limits.prepare_workers, thread_name_prefix="dsgraph-prepare")
        self.drain = Drain()

    async def prepare(self, api: Api, body: bytes) -> tuple[Prepared, int | None]:
        """A body -> the prepared request and the fault hook's count, on the preparation pool."""
        work = functools.partial(self._prepare, api, body)
        return await asyncio.get_running_loop().run_in_executor(self.pool, work)

    def _prepare(self, api: Api, body: bytes) -> tuple[Prepared, int | None]:
        try:
            return self._prepare_values(api, parse_json(body, self.limits))
        finally:
            if len(body) >= TRIM_AFTER_BYTES:
                release_memory()

    def _prepare_values(self, api: Api, values: Any) -> tuple[Prepared, int | None]:
        engine_tok = self.loop.engine.tokenizer
        prep = prepare(
            api, values, self.options, self.recipe_tok, engine_tok, self.max_model_len, self.bytes_per_token
        )
        if self.allow_forced_outputs:
            prep = replace(prep, params=replace(prep.params, golden_token_ids=forced_ids(values)))
        return prep, fault_after(values) if self.allow_fault_injection else None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.loop.close()


def _chunk(event: TokenEvent, want_logprobs: bool, eos: int, text: bool = False) -> dr.InferenceChunk:
    if event.token == eos and event.finished:
        return dr.InferenceChunk.text("", 1)  # counted as a completion token, never shown as text
    if text:  # Prepared.text_chunks
        return dr.InferenceChunk.text(event.text, 1)
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
    state: ServerState, api: Api, prep: Prepared, track: Tracking, fault_after: int | None
) -> AsyncIterator[Event]:
    """Run the request; its engine events through the recipe's StreamProcessor. The first event is
    awaited before the recipe's first output, which reports the prompt-cache hit known only then. An
    engine failure raises ApiError 500; the request is aborted if the consumer leaves."""
    rid, events = await _add(state, prep, fault_after)
    state.metrics.prompt_tokens.inc(len(prep.prompt_ids))
    track.prompt_tokens = len(prep.prompt_ids)
    gen = prep.generator(prep.conv, f"{api.id_prefix}{uuid.uuid4().hex}", state.model_name)
    proc = dr.StreamProcessor(gen, prep.conv.parsing_options, state.recipe_tok)
    want_lp = prep.params.logprobs is not None
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
                track.observe(state.metrics)
                for out in proc.push(_chunk(event, want_lp, state.eos, prep.text_chunks)):
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


async def _serve(state: ServerState, api: Api, body: bytes, track: Tracking) -> Response:
    prep, fault = await state.prepare(api, body)
    chunks = _recipe_chunks(state, api, prep, track, fault)
    # The first chunk comes before the status line: a request failing before its first token gets a
    # real error status, never a 200 stream.
    first = await anext(chunks)
    if prep.stream:
        return StreamingResponse(_sse(api, prepend(first, chunks)), media_type="text/event-stream")
    rid_text, created = api.head(json.loads(first.to_json()))  # id and creation time of the response
    response = api.response(rid_text, state.model_name, created, len(prep.prompt_ids), track.cached_tokens)
    async for chunk in prepend(first, chunks):
        response.accumulate(chunk)
    return Response(response.to_json(), media_type="application/json")


async def _counted_stream(body: AsyncIterator[str], count: Callable[[int], None]) -> AsyncIterator[str]:
    """A response stream counted when it ends: 200 when sent in full, 499 when the client left."""
    status = CLIENT_CLOSED
    try:
        async for part in body:
            yield part
        status = 200
    finally:
        count(status)


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


async def _answer(state: ServerState, api: Api, request: Request, track: Tracking) -> Response | None:
    """The response to one request; None when the client left before it was ready."""
    if state.drain.draining:
        raise ApiError.internal("the server is shutting down", status=503)
    try:
        body = await read_body(request.stream(), request.headers.get("content-length"), state.limits)
    except ClientDisconnect:
        return None
    return await _unless_disconnected(request, _serve(state, api, body, track))


def _route(app: FastAPI, state: ServerState, api: Api) -> None:
    def count(status: int) -> None:
        state.metrics.requests.labels(api.name, str(status)).inc()

    async def handle(request: Request) -> Response:
        track = track_request(request.scope)
        state.drain.track()
        try:
            resp = await _answer(state, api, request, track)
        except ApiError as exc:
            resp = JSONResponse(api.error_body(exc.body), status_code=exc.status)
        except Exception as exc:  # a server bug: this request gets the protocol's error, the server goes on
            err = _internal(exc)
            resp = JSONResponse(api.error_body(err.body), status_code=err.status)
        if resp is None:
            resp = Response(status_code=CLIENT_CLOSED)
        if isinstance(resp, StreamingResponse):  # counted when it ends: the client may leave mid-stream
            resp.body_iterator = _counted_stream(resp.body_iterator, count)  # type: ignore[arg-type]
        else:
            count(resp.status_code)
        return resp

    app.post(api.path, name=api.name)(handle)


def create_app(
    engine: Engine,
    model_name: str,
    recipe_tok: dr.Tokenizer,
    thinking: bool = False,
    allow_forced_outputs: bool = False,
    allow_fault_injection: bool = False,
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
    limits: ServerLimits | None = None,
    enable_openapi: bool = False,
    loop: EngineLoop | None = None,
) -> FastAPI:
    """The server app around one engine; `app.state.server` holds the engine loop and metrics.
    `allow_forced_outputs` / `allow_fault_injection` enable the FORCED_FIELD / FAULT_FIELD test hooks;
    never for a real server. `api_key`: /v1 endpoints need it; `allowed_origins`: CORS (access.py).
    `enable_openapi` serves the schema at /openapi.json; the /docs and /redoc pages are never served
    (FastAPI's load their assets from a public CDN). `loop`: the engine's loop when it is not a plain
    EngineLoop (prefill/decode disaggregation, server/pd_loop.py)."""
    state = ServerState(
        engine, model_name, recipe_tok, thinking, allow_forced_outputs, allow_fault_injection, limits, loop
    )
    app = FastAPI(
        title="dsgraph",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if enable_openapi else None,
    )
    app.state.server = state

    for api in APIS:
        _route(app, state, api)
    add_completions(app, state)
    add_admin(app, state)
    install_access(app, api_key, allowed_origins)

    @app.exception_handler(HTTPException)
    async def unrouted(request: Request, exc: HTTPException) -> Response:
        """404 (no such path), 405 (wrong method): counted, answered in OpenAI's error shape."""
        state.metrics.requests.labels("none", str(exc.status_code)).inc()
        err = ApiError(
            exc.status_code,
            f"{request.method} {request.url.path}: {exc.detail}",
            code=_HTTP_CODES.get(exc.status_code, "invalid_request_error"),
        )
        return JSONResponse(err.body, status_code=exc.status_code, headers=exc.headers)

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
        if state.loop.error is not None:  # only a PublicError's text is shown: never an internal repr
            cause = state.loop.error
            said = str(cause) if isinstance(cause, PublicError) else "the engine is down"
            return JSONResponse({"status": "error", "error": said}, status_code=503)
        if state.drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
