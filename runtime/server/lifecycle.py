"""Draining: the server stops taking requests, lets those in flight finish within a grace period, then
closes what is left. SIGTERM (DrainingServer) and an explicit drain (`Drain.drain`, for an admin endpoint)
take the same path."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from dsgraph.runtime.server.limits import DEFAULT_GRACE_S

__all__ = ["DEFAULT_GRACE_S", "Drain", "DrainingServer"]


class Drain:
    """In-flight request count and the draining flag of one server (touched on its event loop only)."""

    def __init__(self) -> None:
        self.draining = False
        self._tasks: set[asyncio.Task[Any]] = set()
        # a completion server's (pd_app.hand_off_on_drain): given the grace period's end, it lets its
        # decode streams finish until then and hands the rest to other engines
        self.hand_off: Callable[[float], Awaitable[None]] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def track(self) -> None:
        """Called by a request's handler: the request is in flight until its task ends, which is after
        its response was sent (a stream's last event, not its first: the handler has returned by the
        time a StreamingResponse streams). The task is what a drain cancels after the grace period."""
        task = asyncio.current_task()
        assert task is not None, "Drain.track runs inside a request handler"
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def begin(self) -> None:
        """From now on new requests get 503 and /health says "draining"."""
        self.draining = True

    async def drain(self, grace_s: float) -> int:
        """begin(), wait up to `grace_s` for the requests in flight, then cancel those left (which aborts
        them in the engine); returns how many were cancelled."""
        self.begin()
        deadline = time.monotonic() + grace_s
        if self.hand_off is not None:
            await self.hand_off(deadline)
        while self._tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = [t for t in self._tasks if not t.done()]
        for task in left:
            task.cancel()
        return len(left)


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown (SIGTERM, SIGINT) drains first, as POST /admin/drain does: new
    requests get 503 while those in flight have `timeout_graceful_shutdown` seconds to finish (a
    completion server hands those left to other engines with their KV), the rest are cancelled, and the
    connections still open (idle, or a client still sending its body) are closed."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # after POST /admin/drain this finds nothing left in flight and returns at once
        grace = self.config.timeout_graceful_shutdown
        await self.drain.drain(math.inf if grace is None else grace)
        await super().shutdown(sockets)
        for connection in list(self.server_state.connections):
            transport: Any = getattr(connection, "transport", None)
            if transport is not None:
                transport.close()
