"""A prompt server and a completion server on loopback behind one client: the client's completions equal
a NORMAL server's (greedy and seeded, JSON and SSE); a handoff failing at each stage (before send, mid
transfer, damaged bytes, timeout, at admit) ends that request with an error status and leaves nothing
held on either engine; 100 concurrent requests through the pair all complete."""

from __future__ import annotations

import asyncio
import json

import httpx2 as httpx
import pytest

from dsgraph.runtime.kvstore.transport import mooncake_available
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import held_pages, serving, wait_idle
from tests.kvstore.pd_util import MODEL, engine, pd_apps

PROMPT = [(5 * i + 2) % 150 + 5 for i in range(40)]
SEQS = 16
BACKENDS = [
    "torch",
    pytest.param(
        "mooncake",
        marks=pytest.mark.skipif(not mooncake_available(), reason="mooncake does not load (libibverbs.so.1)"),
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request):  # type: ignore[no-untyped-def]
    prompt_app, c_app, pt, ct, _ = pd_apps(request.param, max_num_seqs=SEQS)
    with serving(c_app) as c_url:
        p_app = prompt_app(c_url)
        with serving(p_app) as p_url:
            yield p_url, p_app.state.server, c_app.state.server, pt, ct


@pytest.fixture(scope="module")
def normal_url():  # type: ignore[no-untyped-def]
    e = engine("normal")
    with serving(create_app(e, MODEL, recipe_tokenizer(default_model_dir()))) as url:
        yield url


def _complete(url: str, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, **kw}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


def _chat_stream(url: str, **kw) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "W3 W5 W7 W9"}], "stream": True, **kw}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        return r.status_code, r.read().decode()


def _sse_text(stream: str) -> str:
    chunks = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def _held_nothing(p_state, c_state, pt) -> None:  # type: ignore[no-untyped-def]
    for state in (p_state, c_state):
        wait_idle(state)
        assert held_pages(state.loop.engine) == {1: 0, 2: 0}
        assert state.loop.engine.scheduler.native.num_free_slots == SEQS
    assert c_state.loop.num_pending == 0 and p_state.loop.engine.scheduler.native.num_handoff == 0
    assert not pt.published  # every payload was discarded


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 77}], ids=["greedy", "seeded"]
)
def test_pair_gives_normal_completions(pair, normal_url, sampling) -> None:  # type: ignore[no-untyped-def]
    p_url, p_state, c_state, pt, _ = pair
    want = _complete(normal_url, **sampling)
    got = _complete(p_url, **sampling)
    assert want.status_code == got.status_code == 200, got.text
    w, g = want.json(), got.json()
    assert g["choices"][0]["text"] == w["choices"][0]["text"]
    # (cached_tokens differ: the NORMAL server's prefix cache is shared by every backend's tests)
    for key in ("prompt_tokens", "completion_tokens"):
        assert g["usage"][key] == w["usage"][key]
    assert w["usage"]["completion_tokens"] == 8
    status, stream = _chat_stream(p_url, max_tokens=6, **sampling)
    _, normal_stream = _chat_stream(normal_url, max_tokens=6, **sampling)
    assert status == 200
    assert _sse_text(stream) == _sse_text(normal_stream) and _sse_text(stream)
    _held_nothing(p_state, c_state, pt)


# the faults are injected around the transport, so one backend shows the handling
@pytest.mark.parametrize("pair", ["torch"], indirect=True)
@pytest.mark.parametrize("stage", ["publish", "fetch", "corrupt", "timeout", "admit"])
def test_failed_handoff_is_an_error_and_frees_everything(pair, stage: str) -> None:  # type: ignore[no-untyped-def]
    p_url, p_state, c_state, pt, ct = pair
    side = pt if stage == "publish" else ct
    side.fault = stage
    try:
        r = _complete(p_url, temperature=0)
        status, stream = _chat_stream(p_url, max_tokens=4)
    finally:
        side.fault = None
    assert r.status_code >= 500 and "handoff failed" in r.json()["error"]["message"], r.text
    assert status >= 500 and "handoff failed" in stream
    _held_nothing(p_state, c_state, pt)
    assert _complete(p_url, temperature=0).status_code == 200  # the pair goes on serving


def test_hundred_concurrent_requests_none_lost(pair) -> None:  # type: ignore[no-untyped-def]
    p_url, p_state, c_state, pt, _ = pair

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:

            def body(i: int) -> dict[str, object]:
                return {"model": MODEL, "prompt": [5 + i % 50, 6, 7], "max_tokens": 2, "ignore_eos": True}

            return await asyncio.gather(
                *(client.post(f"{p_url}/v1/completions", json=body(i)) for i in range(100))
            )

    out = asyncio.run(run())
    assert [r.status_code for r in out] == [200] * 100
    assert all(r.json()["usage"]["completion_tokens"] == 2 for r in out)
    _held_nothing(p_state, c_state, pt)
