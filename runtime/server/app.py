"""The ASGI app: POST /v1/chat/completions, /v1/responses, /v1/messages (each SSE or JSON; apis.py),
GET /v1/models, /health, /metrics."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import deepseek_recipe as dr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.sampling_params import RequestError
from dsgraph.runtime.server.apis import APIS, Api, Event
from dsgraph.runtime.server.apis import Response as ApiResponse
from dsgraph.runtime.server.engine_loop import EngineLoop
from dsgraph.runtime.server.metrics import Metrics
from dsgraph.runtime.server.protocol import ApiError, Prepared, conversion_options, prepare

# Test hook: with `create_app(..., allow_forced_outputs=True)` a request body may carry this field, token
# ids the engine emits instead of sampling (SamplingParams.golden_token_ids), so tests can drive reasoning
# and tool-call markup through the recipe's parser. Off by default: the field is then ignored.
FORCED_FIELD = "dsgraph_golden_token_ids"
_FINISH = {"length": dr.InferenceFinishReason.Length, "stop": dr.InferenceFinishReason.Stop}


class ServerState:
    def __init__(
        self,
        engine: Engine,
        model_name: str,
        recipe_tok: dr.Tokenizer,
        thinking: bool,
        allow_forced_outputs: bool = False,
    ) -> None:
        self.allow_forced_outputs = allow_forced_outputs
        self.loop = EngineLoop(engine)
        self.metrics = Metrics(self.loop)
        self.model_name, self.recipe_tok = model_name, recipe_tok
        self.options = conversion_options(model_name, thinking)
        self.max_model_len = engine.model.geo.max_model_len
        self.eos = engine.cfg.eos_token_id


def _chunk(event: TokenEvent, want_logprobs: bool, eos: int) -> dr.InferenceChunk:
    if event.token == eos and event.finished:
        return dr.InferenceChunk.text("", 1)  # counted as a completion token, never shown as text
    lps = [(event.logprob, event.top)] if want_logprobs else None
    return dr.InferenceChunk.tokens([event.token], lps)


async def _recipe_chunks(
    state: ServerState, api: Api, prep: Prepared, rid: int, events: asyncio.Queue[TokenEvent]
) -> AsyncIterator[Event]:
    """Engine events through the recipe's StreamProcessor; aborts the request if the consumer leaves."""
    gen = prep.generator(prep.conv, f"{api.id_prefix}{uuid.uuid4().hex}", state.model_name)
    proc = dr.StreamProcessor(gen, prep.conv.parsing_options, state.recipe_tok)
    want_lp = prep.params.logprobs or prep.params.top_logprobs > 0
    finished = False
    try:
        ready = dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=len(prep.prompt_ids)))
        for out in proc.push(ready):
            yield out
        while not finished:
            event = await events.get()
            finished = event.finished
            if event.token >= 0:
                state.metrics.generated_tokens.inc()
                for out in proc.push(_chunk(event, want_lp, state.eos)):
                    yield out
            if finished and event.finish_reason in _FINISH:
                for out in proc.push(dr.InferenceChunk.finish(_FINISH[event.finish_reason])):
                    yield out
        for out in proc.finish():
            yield out
    finally:
        if not finished:
            state.loop.abort(rid)
            proc.close()


async def _sse(api: Api, chunks: AsyncIterator[Event]) -> AsyncIterator[str]:
    async for chunk in chunks:
        name = api.response.sse_event_name(chunk)
        yield (f"event: {name}\n" if name else "") + f"data: {chunk.to_json()}\n\n"
    done = api.response.sse_done_data()
    if done is not None:
        yield f"data: {done}\n\n"


def _forced_ids(body: bytes) -> tuple[int, ...]:
    """The test hook's token ids (FORCED_FIELD) of a request body; () when absent."""
    try:
        values = json.loads(body)
    except ValueError:
        return ()  # the recipe reports malformed JSON
    if not isinstance(values, dict) or FORCED_FIELD not in values:
        return ()
    ids = values[FORCED_FIELD]
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError(400, f"{FORCED_FIELD}: {ids!r}, expected a list of token ids", FORCED_FIELD)
    return tuple(ids)


async def _serve(state: ServerState, api: Api, body: bytes) -> Response:
    engine_tok = state.loop.engine.tokenizer
    prep = prepare(api, body, state.options, state.recipe_tok, engine_tok, state.max_model_len)
    if state.allow_forced_outputs:
        prep = replace(prep, params=replace(prep.params, golden_token_ids=_forced_ids(body)))
    try:
        rid, events = await state.loop.add(prep.prompt_ids, prep.params)
    except RequestError as exc:
        raise ApiError(400, str(exc), exc.field) from exc
    state.metrics.prompt_tokens.inc(len(prep.prompt_ids))
    chunks = _recipe_chunks(state, api, prep, rid, events)
    if prep.stream:
        return StreamingResponse(_sse(api, chunks), media_type="text/event-stream")
    response: ApiResponse | None = None
    async for chunk in chunks:
        if response is None:  # id and creation time come from the generator's first event
            rid_text, created = api.head(json.loads(chunk.to_json()))
            response = api.response(rid_text, state.model_name, created, len(prep.prompt_ids), 0)
        response.accumulate(chunk)
    assert response is not None, "the recipe produced no event"
    return Response(response.to_json(), media_type="application/json")


def _route(app: FastAPI, state: ServerState, api: Api) -> None:
    async def handle(request: Request) -> Response:
        try:
            resp = await _serve(state, api, await request.body())
        except ApiError as exc:
            resp = JSONResponse(api.error_body(exc.body), status_code=exc.status)
        state.metrics.requests.labels(api.name, str(resp.status_code)).inc()
        return resp

    app.post(api.path, name=api.name)(handle)


def create_app(
    engine: Engine,
    model_name: str,
    recipe_tok: dr.Tokenizer,
    thinking: bool = False,
    allow_forced_outputs: bool = False,
) -> FastAPI:
    """The server app around one engine; `app.state.server` holds the engine loop and metrics.
    `allow_forced_outputs` enables the FORCED_FIELD test hook; never for a real server."""
    state = ServerState(engine, model_name, recipe_tok, thinking, allow_forced_outputs)
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
