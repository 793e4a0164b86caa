"""Forwarding one request: choose an engine, send the body unchanged, relay the answer unchanged.

A request that fails before any byte reached the client (the engine refused the connection, answered
5xx, or dropped it before its first byte) is sent to another engine, up to `max_attempts` engines. A
stream that loses its engine after it began ends with the protocol's error event; so does one whose
engine closed it without its final event. Nothing is truncated silently."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx2 as httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dsgraph.runtime.router import pd
from dsgraph.runtime.router.config import RouterConfig
from dsgraph.runtime.router.metrics import RouterMetrics
from dsgraph.runtime.router.pool import EngineState, Pool
from dsgraph.runtime.router.routes import ERROR_STARTS, Route, Summary, summarize
from dsgraph.runtime.router.select import Choice, NoEngine, Selector
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.limits import ServerLimits, read_body

RETRY_STATUSES = (500, 502, 503, 504)  # the engine's failure, not the request's: another engine may serve it
log = logging.getLogger("dsgraph.router")
_PASSED_HEADERS = ("content-type", "authorization", "x-api-key", "anthropic-version", "x-request-id")


@dataclass
class Ticket:
    """What one request adds to its engines' local load, taken back exactly once."""

    choice: Choice
    tokens: int
    prefilling: bool = True
    streamed: int = 0
    open: bool = True

    def start(self) -> None:
        e = self.choice.engine
        e.in_flight, e.local_kv, e.awaiting_first = (
            e.in_flight + 1,
            e.local_kv + self.tokens,
            e.awaiting_first + 1,
        )
        self._prefill_engine().backlog_s += self.choice.plan.seconds

    def _prefill_engine(self) -> EngineState:
        return self.choice.prefill or self.choice.engine

    def first_byte(self) -> None:
        if self.prefilling:
            self.prefilling = False
            self.choice.engine.awaiting_first -= 1
            p = self._prefill_engine()
            p.backlog_s = max(0.0, p.backlog_s - self.choice.plan.seconds)

    def add_streamed(self, events: int) -> None:
        self.streamed += events
        self.choice.engine.local_kv += events

    def end(self) -> None:
        if self.open:
            self.open = False
            self.first_byte()
            e = self.choice.engine
            e.in_flight, e.local_kv = e.in_flight - 1, e.local_kv - self.tokens - self.streamed


class Forwarder:
    def __init__(
        self,
        cfg: RouterConfig,
        pool: Pool,
        selector: Selector,
        metrics: RouterMetrics,
        client: httpx.AsyncClient,
        limits: ServerLimits,
    ) -> None:
        self.cfg, self.pool, self.selector, self.metrics = cfg, pool, selector, metrics
        self.client, self.limits = client, limits

    async def handle(self, route: Route, request: Request) -> Response:
        body = await read_body(request.stream(), request.headers.get("content-length"), self.limits)
        summary = summarize(body, self.cfg.chars_per_token)
        headers = {k: v for k, v in request.headers.items() if k.lower() in _PASSED_HEADERS}
        tried: list[str] = []
        why = "no engine was tried"
        for _ in range(self.cfg.max_attempts):
            try:
                choice = self.selector.choose(summary.tokens, summary.prefix, tried)
            except NoEngine as exc:
                why = why if tried else str(exc)
                break
            tried.append(choice.engine.url)  # of a pair: its completion engine (prompt engines are few)
            self.metrics.buckets.labels(str(choice.plan.bucket)).inc()
            self.metrics.chunk.observe(choice.plan.chunks[0])
            resp, why = await self._attempt(route, choice, body, headers, summary)
            if resp is not None:
                return resp
            log.warning("attempt %d of %s failed: %s", len(tried), route.path, why)
            self.metrics.retries.inc()
        err = ApiError.internal(f"no engine could take the request: {why}", status=503)
        return JSONResponse(route.error_body(err.body), status_code=503)

    async def _attempt(
        self, route: Route, choice: Choice, body: bytes, headers: dict[str, str], summary: Summary
    ) -> tuple[Response | None, str]:
        """One engine's answer, or (None, why) when the request should go to another engine."""
        engine, ticket = pd.target(choice), Ticket(choice, summary.tokens)
        ticket.start()
        sent = time.monotonic()
        req = self.client.build_request(
            "POST", f"{engine.url}{route.path}", content=body, headers={**headers, **pd.headers(choice)}
        )
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.TransportError as exc:
            return self._failed(ticket, engine, f"{engine.url}: {type(exc).__name__}: {exc}")
        if resp.status_code in RETRY_STATUSES:
            text = (await resp.aread())[:300].decode(errors="replace")
            await resp.aclose()
            ticket.end()
            self.metrics.attempts.labels(f"status_{resp.status_code}").inc()
            return None, f"{engine.url} answered {resp.status_code}: {text}"
        chunks = resp.aiter_raw()
        try:  # the first byte: after it nothing can be retried
            first = await anext(chunks)
        except (httpx.TransportError, StopAsyncIteration) as exc:
            await resp.aclose()
            return self._failed(ticket, engine, f"{engine.url} dropped the request: {type(exc).__name__}")
        ticket.first_byte()
        self._observe(choice, summary.tokens, time.monotonic() - sent)
        self.metrics.attempts.labels("ok").inc()
        media = resp.headers.get("content-type", "application/json")
        relay = self._relay(route, ticket, resp, chunks, first)
        if summary.stream and resp.status_code == 200:
            return StreamingResponse(relay, media_type=media), ""
        return await self._whole(engine, relay, resp.status_code, media)

    async def _whole(
        self, engine: EngineState, relay: AsyncIterator[bytes | str], status: int, media: str
    ) -> tuple[Response | None, str]:
        """A non-streamed answer, read in full before anything is sent (so a failure can be retried)."""
        parts = []
        async for part in relay:
            if isinstance(part, str):  # the relay's error: the engine failed mid-answer
                why = f"{engine.url} failed while answering"
                self.pool.mark_failed(engine, why)
                return None, why
            parts.append(part)
        return Response(b"".join(parts), status_code=status, media_type=media), ""

    def _failed(self, ticket: Ticket, engine: EngineState, why: str) -> tuple[None, str]:
        ticket.end()
        self.pool.mark_failed(engine, why)
        self.metrics.attempts.labels("transport_error").inc()
        return None, why

    def _observe(self, choice: Choice, tokens: int, seconds: float) -> None:
        self.metrics.ttft.observe(seconds)
        engine = choice.prefill or choice.engine
        if engine.in_flight <= 1:  # alone on its engine: the first byte's delay is its prefill time
            self.selector.cost.observe(tokens, seconds)

    async def _relay(
        self, route: Route, ticket: Ticket, resp: httpx.Response, chunks: AsyncIterator[bytes], first: bytes
    ) -> AsyncIterator[bytes | str]:
        """The engine's bytes unchanged; then, if they did not end properly, the protocol's error event
        (a str, so that a non-streamed caller can tell it apart)."""
        tail, failure = b"", ""
        try:
            chunk = first
            while True:
                tail = (tail + chunk)[-8192:]
                ticket.add_streamed(chunk.count(b"\n\n"))
                yield chunk
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
            if route_open(route, tail) and resp.headers.get("content-type", "").startswith(
                "text/event-stream"
            ):
                failure = "the engine closed the stream before its final event"
        except httpx.TransportError as exc:
            failure = f"the engine failed mid-response ({type(exc).__name__})"
        finally:
            await resp.aclose()
            ticket.end()
        if failure:
            log.warning("%s: %s", ticket.choice.engine.url, failure)
            self.metrics.stream_errors.inc()
            message = f"{ticket.choice.engine.url}: {failure}; the response is incomplete, retry the request"
            yield route.sse_error(ApiError.internal(message, status=502).body)


def route_open(route: Route, tail: bytes) -> bool:
    """True when a stream's last event is neither the protocol's final one nor an error."""
    last = tail.rstrip().rsplit(b"\n\n", 1)[-1].lstrip()
    return not any(last.startswith(m) for m in route.ends + ERROR_STARTS)
