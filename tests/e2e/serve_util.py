"""Run an ASGI app on a free loopback port in a thread, for the server tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx2 as httpx  # the HTTP client the `openai` package ships on
import uvicorn


@contextmanager
def serving(app: Any, srv: uvicorn.Server | None = None) -> Iterator[str]:
    """Yield the base URL of `app` served on 127.0.0.1 (by `srv` if given); stop the server and its
    engine loop after."""
    try:
        with running(app, srv=srv) as url:
            yield url
    finally:
        app.state.server.close()


@contextmanager
def running(app: Any, sock: socket.socket | None = None, srv: uvicorn.Server | None = None) -> Iterator[str]:
    """Yield the base URL of any ASGI `app` served on 127.0.0.1 (on `sock`, bound, if given) in a thread,
    by `srv` if given (a server of `app`)."""
    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
    srv = srv or uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        srv.should_exit = True
        thread.join(10)


def scrape(url: str) -> dict[str, float]:
    """The server's /metrics as {series with labels: value}."""
    text = httpx.get(f"{url}/metrics").text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}


def wait_idle(state: Any, timeout: float = 10) -> None:
    """Until the engine loop has no request queued or running (the server's own requests ended)."""
    deadline = time.time() + timeout
    while not (state.loop.idle and not state.loop.engine.has_unfinished):
        assert time.time() < deadline, "requests still in the engine"
        time.sleep(0.02)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Until `condition()` holds (state the server's threads change after the client got its answer)."""
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def held_pages(engine: Any) -> dict[int, int]:
    """Pages per ratio held by requests (used and not merely kept by the prefix cache)."""
    from dsgraph.models.deepseek_v41.step_io import ratios

    return {r: (u := engine.scheduler.page_usage(r)).used - u.idle for r in ratios(engine.model.plans)}
