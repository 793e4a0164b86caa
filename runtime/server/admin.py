"""What a router needs from an engine: GET /load (the engine's load as JSON, cheaper to read than
/metrics' text) and POST /admin/drain (stop admitting, let the requests in flight finish within a grace
period, then exit). /admin needs the --api-key like /v1 (access.py)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.limits import DEFAULT_GRACE_S

MAX_GRACE_S = 3600.0


def load_report(state: Any) -> dict[str, Any]:
    """The engine's load: requests running and queued, KV tokens they hold, and whether it drains."""
    loop, usage = state.loop, state.loop.usage
    return {
        "running": loop.num_running,
        "waiting": loop.num_waiting,
        "kv_tokens": usage.kv_tokens,
        "kv_usage": usage.pages_in_use,
        "max_num_seqs": usage.num_slots,
        "in_flight": state.drain.in_flight,
        "draining": state.drain.draining,
        "healthy": loop.error is None,
    }


async def _grace(request: Request) -> float:
    """`grace_s` from the query or a JSON body; DEFAULT_GRACE_S when neither names it."""
    raw: Any = request.query_params.get("grace_s")
    body = await request.body()
    if raw is None and body.strip():
        try:
            values = await request.json()
        except ValueError as exc:
            raise ApiError(400, f"body: not JSON ({exc})") from exc
        raw = values.get("grace_s") if isinstance(values, dict) else None
    if raw is None:
        return DEFAULT_GRACE_S
    try:
        grace = float(raw)
    except (TypeError, ValueError):
        raise ApiError(400, f"grace_s: {raw!r} is not a number", "grace_s") from None
    if not (math.isfinite(grace) and 0 <= grace <= MAX_GRACE_S):
        raise ApiError(400, f"grace_s: {grace} is outside [0, {MAX_GRACE_S}]", "grace_s")
    return grace


async def _drain_then_exit(state: Any, grace_s: float, on_drained: Callable[[], None] | None) -> None:
    await state.drain.drain(grace_s)
    if on_drained is not None:
        on_drained()


def add_admin(app: FastAPI, state: Any) -> None:
    """GET /load and POST /admin/drain on `app`. `app.state.on_drained` (set by `dsgraph serve` to stop
    uvicorn) runs once the drain has ended; without it the server stays up, answering 503."""
    tasks: set[asyncio.Task[None]] = set()

    @app.get("/load")
    async def load() -> JSONResponse:
        return JSONResponse(load_report(state))

    @app.post("/admin/drain")
    async def drain(request: Request) -> JSONResponse:
        try:
            grace = await _grace(request)
        except ApiError as exc:
            return JSONResponse(exc.body, status_code=exc.status)
        if not tasks and not state.drain.draining:
            hook = getattr(app.state, "on_drained", None)
            task = asyncio.ensure_future(_drain_then_exit(state, grace, hook))
            tasks.add(task)  # held so the task is not collected before it ends
        body = {"status": "draining", "in_flight": state.drain.in_flight, "grace_s": grace}
        return JSONResponse(body, status_code=202)
