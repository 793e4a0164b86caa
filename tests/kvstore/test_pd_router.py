"""`dsgraph router --prefill URL --decode URL` in front of a prompt server and a completion server on
loopback (one process, threads): the client's completions equal one NORMAL server's (greedy, JSON and
SSE); a request the prompt engine fails, a streamed completion whose handoff fails before its first
token and a prompt engine that is gone give the client an error status, never an empty 200; a prompt
server refuses a decode URL outside its --pd-peer list; the router's prefill chunk size reaches the
prompt engine's scheduler."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest

from dsgraph.runtime.router.app import create_router_app
from dsgraph.runtime.router.config import RouterConfig
from dsgraph.runtime.router.cost import QuadraticCost
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.hooks import FAULT_FIELD
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import held_pages, running, serving, wait_idle
from tests.kvstore.pd_util import MODEL, engine, pd_apps

PROMPT = [(7 * i + 3) % 150 + 5 for i in range(40)]


class Pair:
    def __init__(self, stack: contextlib.ExitStack) -> None:
        prompt_app, c_app, self.pt, _, _ = pd_apps("torch", max_num_seqs=4)
        self.c_url = stack.enter_context(serving(c_app))
        self.p_app = prompt_app(self.c_url, allow_fault_injection=True)
        self.prompt = contextlib.ExitStack()
        self.p_url = self.prompt.enter_context(serving(self.p_app))
        cfg = RouterConfig(prefill=(self.p_url,), decode=(self.c_url,), poll_interval_s=0.1, max_attempts=2)
        self.url = stack.enter_context(running(create_router_app(cfg)))
        self.c_state = c_app.state.server
        _wait(lambda: httpx.get(f"{self.url}/health", timeout=2).status_code == 200)


def _wait(ok: Any, timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while not ok():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with contextlib.ExitStack() as stack:
        p = Pair(stack)
        stack.callback(p.prompt.close)
        yield p


@pytest.fixture(scope="module")
def normal_url() -> Iterator[str]:
    with serving(create_app(engine("normal"), MODEL, recipe_tokenizer(default_model_dir()))) as url:
        yield url


def _complete(url: str, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **kw}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)


def _stream_text(url: str) -> str:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])


def test_router_pair_gives_a_normal_engines_tokens(pair: Pair, normal_url: str) -> None:
    want = _complete(normal_url).json()["choices"][0]["text"]
    r = _complete(pair.url)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want and want
    assert _stream_text(pair.url) == want
    assert pair.c_state.loop.engine.pd.admitted == 2  # both decoded on the completion engine
    wait_idle(pair.c_state)
    assert held_pages(pair.c_state.loop.engine) == {1: 0, 2: 0} and not pair.pt.published


def test_the_prompt_server_refuses_a_decode_url_not_in_its_peers(pair: Pair) -> None:
    r = _complete(pair.p_url, headers={"x-dsgraph-decode-url": "http://127.0.0.1:9"})
    assert r.status_code == 400 and "x-dsgraph-decode-url" in r.text


def test_the_routers_chunk_size_reaches_the_prompt_engine(
    pair: Pair, normal_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a cost model of 1 ms per token and a 10 ms step budget: the 40-token prompt in chunks of 10
    cfg = RouterConfig(
        prefill=(pair.p_url,),
        decode=(pair.c_url,),
        poll_interval_s=0.1,
        prefill_budget_s=0.01,
        min_chunk_tokens=1,
    )
    scheduler = pair.p_app.state.server.loop.engine.scheduler
    asked: list[int] = []
    add = scheduler.add_request

    def spy(*args: Any, **kw: Any) -> None:
        asked.append(kw["max_chunk"])
        add(*args, **kw)

    monkeypatch.setattr(scheduler, "add_request", spy)
    with running(create_router_app(cfg, QuadraticCost(0.0, 1e-3, 0.0))) as url:
        _wait(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200)
        r = _complete(url)
    assert r.status_code == 200, r.text
    assert asked == [10]  # the prompt engine prefilled it 10 tokens a step
    assert r.json()["choices"][0]["text"] == _complete(normal_url).json()["choices"][0]["text"]
    bad = _complete(pair.p_url, headers={"x-dsgraph-prefill-chunk": "0"})
    assert bad.status_code == 400 and "x-dsgraph-prefill-chunk" in bad.text, bad.text


def test_a_streamed_completion_whose_handoff_fails_gets_an_error_status(pair: Pair) -> None:
    # the status line waits for the first token: a handoff that fails before it (here the publish; a
    # completion engine gone or draining alike) is an error status a router retries on another pair,
    # not a 200 whose stream holds only the error
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": True}
    pair.pt.fault = "publish"
    try:
        with httpx.stream("POST", f"{pair.p_url}/v1/completions", json=body, timeout=30) as s:
            s.read()
    finally:
        pair.pt.fault = None
    assert s.status_code == 500 and "publish failed" in s.json()["error"]["message"], s.text
    assert _stream_text(pair.p_url) == _stream_text(pair.url)  # the pair serves on


def test_a_failed_prefill_is_an_error_status_not_an_empty_200(pair: Pair) -> None:
    # the prompt engine fails the request at its first token: retried, then an error to the client
    body = {"model": MODEL, "messages": [{"role": "user", "content": "W3 W5"}], FAULT_FIELD: 0}
    r = httpx.post(f"{pair.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code >= 500 and r.json()["error"]["message"], r.text
    # the prompt server is gone: the router cannot reach it and answers an error, not an empty 200
    pair.prompt.close()
    r = _complete(pair.url)
    assert r.status_code == 503 and r.json()["error"]["message"], r.text
    body = {"model": MODEL, "prompt": PROMPT, "stream": True}
    with httpx.stream("POST", f"{pair.url}/v1/completions", json=body, timeout=30) as s:
        assert s.status_code == 503
