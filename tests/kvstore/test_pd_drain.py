"""Drain with KV handoff: a prompt server with two completion servers (--pd-peer A B); draining A while
it decodes moves each of its requests, with its caches, to B (through the existing handoff format and
transport) instead of waiting for them or cutting them off. No request is lost and every one's text
equals the undisturbed pair's; neither engine holds anything afterwards. SIGTERM on a completion server
(`dsgraph serve`'s DrainingServer, --shutdown-timeout 0) takes the same path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx2 as httpx
import pytest
import uvicorn

from dsgraph.runtime.kvstore.transport import make_transport
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.lifecycle import DrainingServer
from dsgraph.runtime.server.pd_app import add_pd_decode, add_pd_prompt
from dsgraph.runtime.server.pd_loop import CompletionLoop, PromptLoop
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import held_pages, serving, wait_idle
from tests.kvstore.pd_util import MODEL, FaultyTransport, engine

PROMPT = [(5 * i + 4) % 140 + 5 for i in range(20)]
BODY = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
STREAMS = 2


def _completion_app(tok: Any) -> tuple[Any, FaultyTransport]:
    e = engine("completion")
    transport = FaultyTransport(make_transport("torch"))
    app = create_app(e, MODEL, tok, loop=CompletionLoop(e, admit_timeout_s=30))
    add_pd_decode(app, transport, 10.0)
    return app, transport


def _completion(stack: contextlib.ExitStack, tok: Any) -> tuple[str, Any, FaultyTransport]:
    app, transport = _completion_app(tok)
    return stack.enter_context(serving(app)), app.state.server, transport


def _prompt(stack: contextlib.ExitStack, tok: Any, peers: list[str]) -> tuple[str, FaultyTransport]:
    pe = engine("prompt")
    pt = FaultyTransport(make_transport("torch"))
    p_app = create_app(pe, MODEL, tok, loop=PromptLoop(pe, peers, pt, timeout_s=10))
    add_pd_prompt(p_app)
    return stack.enter_context(serving(p_app)), pt


@pytest.fixture(scope="module")
def trio() -> Iterator[tuple[str, str, list[Any], list[FaultyTransport]]]:
    tok = recipe_tokenizer(default_model_dir())
    with contextlib.ExitStack() as stack:
        (a_url, a, at), (b_url, b, bt) = _completion(stack, tok), _completion(stack, tok)
        url, pt = _prompt(stack, tok, [a_url, b_url])
        yield url, a_url, [a, b], [pt, at, bt]


def _drain_call(drain_url: str) -> Callable[[httpx.AsyncClient], Awaitable[None]]:
    async def drain(client: httpx.AsyncClient) -> None:
        r = await client.post(f"{drain_url}/admin/drain", json={"grace_s": 0})
        assert r.status_code == 202

    return drain


async def _streams(url: str, stop: Callable[[httpx.AsyncClient], Awaitable[None]]) -> list[str]:
    """STREAMS streams through the prompt server at `url`; `stop` drains a completion server once each
    has a token."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(120)) as client:
        started = [asyncio.Event() for _ in range(STREAMS)]

        async def one(i: int) -> str:
            text = ""
            async with client.stream("POST", f"{url}/v1/completions", json={**BODY, "stream": True}) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        value = json.loads(line[6:])
                        assert "error" not in value, value
                        text += value["choices"][0]["text"]
                        started[i].set()
                    elif line == "data: [DONE]":
                        return text
            raise AssertionError("the stream ended without [DONE]")

        tasks = [asyncio.ensure_future(one(i)) for i in range(STREAMS)]
        await asyncio.gather(*(e.wait() for e in started))
        await stop(client)
        return list(await asyncio.gather(*tasks))


def test_draining_a_completion_engine_moves_its_requests_with_their_kv(trio) -> None:  # type: ignore[no-untyped-def]
    url, a_url, (a, b), transports = trio
    want = httpx.post(f"{url}/v1/completions", json=BODY, timeout=60).json()["choices"][0]["text"]
    assert a.loop.engine.pd.admitted == 1  # the first peer decodes by default
    texts = asyncio.run(_streams(url, _drain_call(a_url)))
    assert texts == [want] * STREAMS
    assert a.loop.moved == STREAMS and b.loop.engine.pd.admitted == STREAMS
    for state in (a, b):
        wait_idle(state)
        assert held_pages(state.loop.engine) == {1: 0, 2: 0}
    assert all(not t.published for t in transports) and a.loop.moving == 0


def test_sigterm_on_a_completion_server_moves_its_requests_with_their_kv() -> None:
    tok = recipe_tokenizer(default_model_dir())
    a_app, _ = _completion_app(tok)
    # served as `dsgraph serve` serves it, with --shutdown-timeout 0
    config = uvicorn.Config(a_app, log_level="warning", timeout_graceful_shutdown=0)
    srv = DrainingServer(config, a_app.state.server.drain)
    with contextlib.ExitStack() as stack:
        a_url = stack.enter_context(serving(a_app, srv))
        b_url, b, _ = _completion(stack, tok)
        url, _ = _prompt(stack, tok, [a_url, b_url])
        want = httpx.post(f"{url}/v1/completions", json=BODY, timeout=60).json()["choices"][0]["text"]

        async def sigterm(client: httpx.AsyncClient) -> None:
            srv.handle_exit(signal.SIGTERM, None)  # what SIGTERM does to `dsgraph serve`

        assert asyncio.run(_streams(url, sigterm)) == [want] * STREAMS
        assert a_app.state.server.loop.moved == STREAMS and b.loop.engine.pd.admitted == STREAMS
        deadline = time.time() + 20
        while _answers(a_url):  # it stops listening once its requests have moved
            assert time.time() < deadline, "the completion server did not exit"
            time.sleep(0.05)


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.TransportError:
        return False
    return True
