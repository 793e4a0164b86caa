"""The router's forwarding against stub engines (no model): a 503 or a refused connection is retried on
another engine, a stream cut after it began or closed without its final event ends with the protocol's
error event, a 4xx is passed through, no engine gives a 503 in the protocol's shape, and an engine that
comes back rejoins."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from contextlib import ExitStack
from typing import Any

import httpx2 as httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dsgraph.runtime.router.app import create_router_app
from dsgraph.runtime.router.config import RouterConfig
from tests.e2e.serve_util import running

EVENT = 'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}]}\n\n'


def _stub(mode: str, served: list[str]) -> FastAPI:
    """An engine that answers chat with `mode`: ok, busy (503), cut (stream ends without [DONE]),
    bad (400)."""
    app = FastAPI()

    @app.get("/load")
    async def load() -> dict[str, Any]:
        # "busy" has just begun draining: the router has not polled since, so it still sends requests
        return {"running": 0, "waiting": 0, "kv_tokens": 0, "draining": False, "healthy": True}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        served.append(mode)
        body = json.loads(await request.body())
        if mode == "busy":
            return JSONResponse({"error": {"message": "draining"}}, status_code=503)
        if mode == "bad":
            return JSONResponse({"error": {"message": "messages: required", "param": "messages"}}, 400)
        if not body.get("stream"):
            return JSONResponse({"choices": [{"message": {"content": "xx"}}]})

        async def events() -> Any:
            yield EVENT
            await asyncio.sleep(0.01)
            yield EVENT
            if mode == "ok":
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _router(*urls: str, poll_s: float = 0.05) -> Any:
    cfg = RouterConfig(normal=urls, poll_interval_s=poll_s, policy="round_robin")
    return running(create_router_app(cfg))


def _metric(url: str, name: str) -> float:
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(x.split()[-1]) for x in lines if x.startswith(name) and x[len(name)] in " {")


def _chat(url: str, stream: bool) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_a_refused_or_busy_engine_is_retried_before_the_first_byte() -> None:
    served: list[str] = []
    with running(_stub("ok", served)) as ok, running(_stub("busy", served)) as busy, ExitStack() as stack:
        with running(_stub("gone", served)) as gone:
            r = stack.enter_context(_router(ok, busy, gone, poll_s=30))  # no poll before the checks end
        # `gone` was healthy at the router's first poll and has stopped: connections are refused
        for _ in range(6):
            resp = _chat(r, stream=True)
            assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
            assert resp.text.count("data: {") == 2  # the stream as the engine sent it, nothing added
        assert served.count("ok") == 6 and served.count("busy") >= 1 and "gone" not in served
        assert _metric(r, "dsgraph_router_retries_total") >= 2  # after the 503 and after the refusal
        state = {e["url"]: e for e in httpx.get(f"{r}/engines").json()["engines"]}
        assert not state[gone]["healthy"] and "ConnectError" in state[gone]["last_error"]


@pytest.mark.parametrize("stream", [True, False])
def test_a_stream_cut_after_it_began_ends_with_an_error_event(stream: bool) -> None:
    served: list[str] = []
    with running(_stub("cut", served)) as cut, _router(cut) as r:
        resp = _chat(r, stream)
        if stream:
            last = resp.text.rstrip().rsplit("\n\n", 1)[-1]
            assert resp.text.count(EVENT) == 2 and last.startswith('data: {"error"')
            assert "incomplete" in json.loads(last[6:])["error"]["message"]
            assert "dsgraph_router_stream_errors_total 1.0" in httpx.get(f"{r}/metrics").text
        else:  # a whole answer needs no final event
            assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "xx"


def test_a_client_error_passes_through_and_no_engine_is_a_503_in_the_protocols_shape() -> None:
    served: list[str] = []
    with running(_stub("bad", served)) as bad, _router(bad) as r:
        resp = _chat(r, stream=False)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
        assert served == ["bad"]  # a 4xx is the request's fault: not retried
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, not listening: never healthy
    with _router(f"http://127.0.0.1:{dead.getsockname()[1]}") as r:
        msg = httpx.post(f"{r}/v1/messages", json={"model": "m", "max_tokens": 2, "messages": []}, timeout=30)
        assert msg.status_code == 503 and msg.json()["type"] == "error"  # Anthropic's error object
        assert httpx.get(f"{r}/health").status_code == 503
    dead.close()


def test_an_engine_that_comes_back_rejoins() -> None:
    served: list[str] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with _router(url) as r:
        assert _chat(r, stream=False).status_code == 503  # nothing listens yet
        with running(_stub("ok", served), sock):
            deadline = time.time() + 10
            while httpx.get(f"{r}/health").status_code != 200:
                assert time.time() < deadline, httpx.get(f"{r}/engines").json()
                time.sleep(0.05)
            assert _chat(r, stream=False).status_code == 200 and served == ["ok"]
