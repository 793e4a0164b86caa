"""Draining: the server stops taking requests, lets those in flight finish within a grace period, then
closes what is left. SIGTERM (DrainingServer) and an explicit drain (`Drain.drain`, for an admin endpoint)
take the same path."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import uvicorn

DEFAULT_GRACE_S = 30.0  # as Kubernetes' default terminationGracePeriodSeconds


class Drain:
    """In-flight request count and the draining flag of one server (touched on its event loop only)."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0

    def begin(self) -> None:
        """From now on new requests get 503 and /health says "draining"."""
        self.draining = True

    async def drain(self, grace_s: float) -> bool:
        """begin(), then wait up to `grace_s` for the requests in flight; True when none is left (those
        left are cancelled by their server, which aborts them in the engine)."""
        self.begin()
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.in_flight == 0


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown (SIGTERM, SIGINT) drains first: new requests on open connections
    get 503 while uvicorn waits `timeout_graceful_shutdown` for those in flight, cancels the rest, and
    the connections still open (idle, or a client still sending its body) are closed."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.begin()
        await super().shutdown(sockets)
        for connection in list(self.server_state.connections):
            transport: Any = getattr(connection, "transport", None)
            if transport is not None:
                transport.close()
