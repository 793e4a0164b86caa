"""Prefill/decode disaggregation in the server. A completion server serves `POST /v1/pd/decode`: the body
names where the handoff lies (the transport locator) and the request's sampling params; the server pulls
the bytes, reads the keyed pages from its store, admits the request and streams its TokenEvents as JSON
lines (the first line `{"admitted": rid}`). A transfer that fails or times out, damaged bytes and a
refused admission are answered with an error status before any line, and nothing stays reserved. The
client-facing API runs on the prompt server (pd_loop.PromptLoop relays the stream)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dsgraph.runtime.kvstore.handoff import Handoff, HandoffError
from dsgraph.runtime.kvstore.pd_engines import check_admissible, fetch_pages
from dsgraph.runtime.kvstore.transport import TransferError, Transport, pack_payload, unpack_payload
from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.server.engine_loop import EngineDead
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.limits import parse_json, read_body
from dsgraph.runtime.server.pd_loop import (
    DECODE_PATH,
    DECODE_PEER,
    MOVED,
    PREFILL_CHUNK,
    CompletionLoop,
    PromptLoop,
    event_json,
)
from dsgraph.runtime.server.pd_metrics import register_pd_metrics


@dataclass
class DecodeCounts:
    """What the decode endpoint did (tests and /metrics read it)."""

    admitted: int = 0
    transfer_failures: int = 0  # fetch failed, timed out or gave damaged bytes
    refused: int = 0  # the handoff or params could not be admitted


async def _handoff(
    loop: CompletionLoop, transport: Transport, locator: dict[str, Any], timeout_s: float
) -> tuple[Handoff, dict[int, list[bytes]]]:
    payload = await asyncio.to_thread(transport.fetch, locator, timeout_s)
    handoff = Handoff.unpack(unpack_payload(payload, f"handoff from {locator.get('backend')}"))
    pages = await asyncio.to_thread(fetch_pages, loop.engine, handoff)  # store reads: off the event loop
    return handoff, pages


def _fail(counts: DecodeCounts, exc: Exception) -> JSONResponse:
    if isinstance(exc, TransferError):
        counts.transfer_failures += 1
        status = 504 if "timed out" in str(exc) else 502
    elif isinstance(exc, RequestError):
        counts.refused += 1
        status = 400
    elif isinstance(exc, EngineDead):
        status = 503
    else:
        counts.refused += 1
        status = 502
    err = (
        ApiError.internal(f"{type(exc).__name__}: {exc}", status=status)
        if status != 400
        else ApiError(400, str(exc))
    )
    return JSONResponse(err.body, status_code=status)


def add_pd_decode(app: FastAPI, transport: Transport, default_timeout_s: float = 60.0) -> DecodeCounts:
    """Serve DECODE_PATH on a completion server's app (its ServerState's loop is a CompletionLoop)."""
    state = app.state.server
    loop: CompletionLoop = state.loop
    counts = DecodeCounts()

    @app.post(DECODE_PATH)
    async def decode(request: Request) -> Response:
        if state.drain.draining:
            return _fail(counts, EngineDead("the completion server is draining"))
        body = await read_body(request.stream(), request.headers.get("content-length"), state.limits)
        values = parse_json(body, state.limits)
        try:
            params = SamplingParams.from_dict(values["params"])
            timeout_s = float(values.get("timeout_s", default_timeout_s))
            handoff, pages = await _handoff(loop, transport, values["locator"], timeout_s)
            check_admissible(loop.engine, handoff, params)
            rid, events = await loop.add_prefilled(handoff, pages, params)
        except (KeyError, TypeError) as exc:
            return _fail(counts, RequestError("body", repr(exc), "an object with 'locator' and 'params'"))
        except (TransferError, HandoffError, RequestError, EngineDead, RuntimeError, ValueError) as exc:
            return _fail(counts, exc)
        counts.admitted += 1
        lines = _lines(loop, rid, events, transport, timeout_s)
        return StreamingResponse(lines, media_type="application/x-ndjson")

    state.drain.hand_off = lambda deadline: hand_off_on_drain(loop, deadline, default_timeout_s)
    return counts


async def hand_off_on_drain(loop: CompletionLoop, deadline: float, timeout_s: float) -> None:
    """A draining completion server: the requests it decodes may finish until `deadline` (the grace
    period); those left move to another completion engine (their prompt server picks it) with their
    caches, instead of being cut off. Returns once every moved one was taken (or `timeout_s` later)."""
    import time

    while loop.num_running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if loop.num_running or loop.num_pending:
        await loop.move_all()
    until = time.monotonic() + timeout_s
    while loop.moving and time.monotonic() < until:
        await asyncio.sleep(0.05)


class RouterHeaders:
    """ASGI middleware of a prompt server: the completion server a router chose (its
    `x-dsgraph-decode-url` header) becomes DECODE_PEER for the request's handler, and its prefill chunk
    size (`x-dsgraph-prefill-chunk`) PREFILL_CHUNK; PromptLoop.add reads both (and refuses a peer not in
    --pd-peer, a chunk that is not a positive number). A plain ASGI wrapper: the handler runs in this
    task, so the context variables reach it."""

    HEADERS = ((b"x-dsgraph-decode-url", DECODE_PEER), (b"x-dsgraph-prefill-chunk", PREFILL_CHUNK))

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        given = dict(scope["headers"]) if scope["type"] == "http" else {}
        tokens = [(var, var.set(_text(given.get(name)))) for name, var in self.HEADERS]
        try:
            await self.app(scope, receive, send)
        finally:
            for var, token in reversed(tokens):
                var.reset(token)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def add_pd_prompt(app: FastAPI) -> None:
    """A prompt server takes the completion server a router names per request (router/pd.py)."""
    app.add_middleware(RouterHeaders)


def install_pd(app: FastAPI, engine_type: str, transport: Transport, store: Any, timeout_s: float) -> None:
    """The PD side of a prompt or completion server: the decode endpoint (completion) and the store and
    handoff series of /metrics."""
    state = app.state.server
    if engine_type == "completion":
        counts = add_pd_decode(app, transport, timeout_s)
        read = lambda: {  # noqa: E731
            "admitted": counts.admitted,
            "transfer_failed": counts.transfer_failures,
            "refused": counts.refused,
        }
    else:
        add_pd_prompt(app)
        loop: PromptLoop = state.loop
        read = lambda: {"exported": loop.engine.pd.exported, "failed": loop.failures}  # noqa: E731
    register_pd_metrics(state.metrics.registry, store, read)


async def _lines(
    loop: CompletionLoop, rid: int, events: asyncio.Queue[Any], transport: Transport, timeout_s: float
) -> AsyncIterator[str]:
    finished = False
    try:
        yield f'{{"admitted": {rid}}}\n'
        while not finished:
            event = await events.get()
            finished = event.finished
            if event.finish_reason == MOVED:
                async for line in _moved(loop, rid, event.handoff.handoff, transport, timeout_s):
                    yield line
                return
            yield event_json(event) + "\n"
    finally:
        if not finished:  # the prompt server left (its client did): the request stops here too
            loop.abort(rid)


async def _moved(
    loop: CompletionLoop, rid: int, handoff: Handoff, transport: Transport, timeout_s: float
) -> AsyncIterator[str]:
    """The MOVED line with the handoff's locator; the payload stays published until the prompt server
    closes this stream (the next engine has admitted the request) or `timeout_s` passes."""
    handoff_id = f"moved-{id(loop)}-{rid}"
    loop.moving += 1
    try:
        locator = await asyncio.to_thread(transport.publish, handoff_id, pack_payload(handoff.pack()))
        yield json.dumps({MOVED: locator}) + "\n"
        await asyncio.sleep(timeout_s)
    finally:
        loop.moving -= 1
        transport.discard(handoff_id)
