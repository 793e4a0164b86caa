"""One structured log line per request: an ASGI middleware that times every request (401s and 404s
included), gives it an id (returned as `x-request-id`) and, when its response has been sent (a stream's
last chunk too), logs one JSON object on the `dsgraph.request` logger: id, method, endpoint, status,
prompt / cached / completion tokens, time to first token and total time. A handler reports the tokens
through the `Tracking` it stores in the request's scope (`track_request`)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsgraph.runtime.server.metrics import Metrics

__all__ = ["LOGGER_NAME", "RequestLog", "Tracking", "track_request"]

LOGGER_NAME = "dsgraph.request"
_SCOPE_KEY = "dsgraph.tracking"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class Tracking:
    """One request's timing and token counts (the latency histograms and the request log read it)."""

    start: float  # time.monotonic() when the request arrived
    first: float | None = None  # when its first token arrived
    last: float | None = None  # when its latest token arrived
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def token(self) -> float | None:
        """Count one generated token; returns the time since the previous one (None for the first)."""
        now = time.monotonic()
        gap = None if self.last is None else now - self.last
        self.first = now if self.first is None else self.first
        self.last, self.completion_tokens = now, self.completion_tokens + 1
        return gap

    def observe(self, metrics: Metrics) -> None:
        """Count one generated token into the latency histograms too (first token, inter-token)."""
        gap = self.token()
        if gap is None:
            metrics.time_to_first_token.observe(self.last - self.start)  # type: ignore[operator]
        else:
            metrics.inter_token_latency.observe(gap)


def track_request(scope: Scope) -> Tracking:
    """The request's Tracking (made by RequestLog, or here when the app runs without it)."""
    track = scope.get(_SCOPE_KEY)
    if track is None:
        track = scope[_SCOPE_KEY] = Tracking(time.monotonic())
    return track


class RequestLog:
    """ASGI middleware writing the one line per HTTP request."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self.logger = logging.getLogger(LOGGER_NAME)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        track = scope[_SCOPE_KEY] = Tracking(time.monotonic())
        rid, status = uuid.uuid4().hex, 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", rid.encode()))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.logger.info(json.dumps(_line(rid, scope, status, track)))


def _line(rid: str, scope: Scope, status: int, track: Tracking) -> dict[str, Any]:
    end = time.monotonic()
    ttft = None if track.first is None else round(track.first - track.start, 6)
    return {
        "request_id": rid,
        "method": scope.get("method"),
        "endpoint": scope.get("path"),
        "status": status or 499,  # no response started: the client left first
        "prompt_tokens": track.prompt_tokens,
        "cached_tokens": track.cached_tokens,
        "completion_tokens": track.completion_tokens,
        "ttft_s": ttft,
        "total_s": round(end - track.start, 6),
    }
