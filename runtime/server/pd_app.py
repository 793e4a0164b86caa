"""Prefill/decode disaggregation in the server. A completion server serves `POST /v1/pd/decode`: the body
names where the handoff lies (the transport locator) and the request's sampling params; the server pulls
the bytes, reads the keyed pages from its store, admits the request and streams its TokenEvents as JSON
lines (the first line `{"admitted": rid}`). A transfer that fails or times out, damaged bytes and a
refused admission are answered with an error status before any line, and nothing stays reserved. The
client-facing API runs on the prompt server (pd_loop.PromptLoop relays the stream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dsgraph.runtime.kvstore.handoff import Handoff, HandoffError
from dsgraph.runtime.kvstore.pd_engines import check_admissible, fetch_pages
from dsgraph.runtime.kvstore.transport import TransferError, Transport, unpack_payload
from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.server.engine_loop import EngineDead
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.limits import parse_json, read_body
from dsgraph.runtime.server.pd_loop import DECODE_PATH, CompletionLoop, PromptLoop, event_json
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
        return StreamingResponse(_lines(loop, rid, events), media_type="application/x-ndjson")

    return counts


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
        loop: PromptLoop = state.loop
        read = lambda: {"exported": loop.engine.pd.exported, "failed": loop.failures}  # noqa: E731
    register_pd_metrics(state.metrics.registry, store, read)


async def _lines(loop: CompletionLoop, rid: int, events: asyncio.Queue[Any]) -> AsyncIterator[str]:
    finished = False
    try:
        yield f'{{"admitted": {rid}}}\n'
        while not finished:
            event = await events.get()
            finished = event.finished
            yield event_json(event) + "\n"
    finally:
        if not finished:  # the prompt server left (its client did): the request stops here too
            loop.abort(rid)
