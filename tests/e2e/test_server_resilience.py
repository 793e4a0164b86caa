"""The server survives what one request or one engine failure does: NaN logits fail only their request,
a failed engine loop restarts, a large body never holds up /health, the status counts add up against
what a mixed load sent, SIGTERM drains, and Hypothesis-generated bodies get a 2xx/4xx in the protocol's
shape while the server goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx  # the HTTP client the `openai` package ships on
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.lifecycle import DrainingServer
from dsgraph.runtime.server.limits import ServerLimits
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import scrape, serving, wait_for, wait_idle
from tests.e2e.test_server_hostile import MESSAGES, MODEL, PATHS, check_error, good, still_serving
from tests.engine_faults import poison_logits, poison_samples

LIMITS = ServerLimits(max_body_bytes=64 * 1024, max_json_depth=32, max_array_items=100)


def _app(limits: ServerLimits = LIMITS, **engine_kw: object):  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=128, max_num_seqs=4, **engine_kw))  # type: ignore[arg-type]
    return create_app(engine, MODEL, recipe_tokenizer(root), limits=limits)


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    app = _app()
    with serving(app) as url:
        yield url, app.state.server


def _chat(url: str, content: str, **kw: object) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 6, **kw}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def _poison_rows(engine, plan, poison: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The sample rows of `plan` whose request's prompt holds the token `poison`."""
    rows = []
    for i, rid in enumerate(plan.sample_rids.tolist()):
        live = engine.live.get(int(rid))
        if live is not None and poison in live.prompt:
            rows.append(i)
    return rows


@pytest.mark.parametrize("fault", ["nan", "+inf", "token"])
def test_invalid_logits_or_tokens_fail_only_their_request(server, fault: str) -> None:  # type: ignore[no-untyped-def]
    url, state = server
    engine = state.loop.engine
    poison = engine.tokenizer.token_to_id("W9")
    alone = [_chat(url, f"W3 W{k}", temperature=0).json()["choices"][0]["message"] for k in (4, 5, 6)]
    rows = lambda plan: _poison_rows(engine, plan, poison)  # noqa: E731
    if fault == "token":
        undo = poison_samples(engine, rows, engine.cfg.text.vocab_size + 5)
        cause = f"sampled token id {engine.cfg.text.vocab_size + 5} is outside the vocabulary"
    else:
        undo = poison_logits(engine, rows, 7, float("nan") if fault == "nan" else float("inf"))
        cause = "the model's logits hold NaN or +inf"
    try:
        with ThreadPoolExecutor(4) as pool:
            bad = pool.submit(_chat, url, "W9 W9 W9", temperature=0)
            goods = [pool.submit(_chat, url, f"W3 W{k}", temperature=0) for k in (4, 5, 6)]
            check_error("chat", bad.result(), 500, cause)
            assert [g.result().json()["choices"][0]["message"] for g in goods] == alone
    finally:
        undo()
    wait_idle(state)
    still_serving(url)


def test_an_engine_loop_failure_errors_the_requests_in_flight_and_restarts(server) -> None:  # type: ignore[no-untyped-def]
    url, state = server
    engine, failed = state.loop.engine, []
    step = engine.step

    def fail_once() -> list[object]:
        if not failed:
            failed.append(1)
            raise RuntimeError("engine bug (test)")
        return step()

    restarts = state.loop.restarts
    engine.step = fail_once
    try:
        check_error("chat", _chat(url, "W3 W5"), 500, "engine bug (test)", "dropped every request")
    finally:
        del engine.step
    # the request's error event goes out before the loop resets the engine and counts the restart
    wait_for(lambda: state.loop.restarts > restarts and state.loop.error is None, "the loop restarted")
    assert state.loop.restarts == restarts + 1
    still_serving(url)


@pytest.mark.slow
def test_a_large_body_never_holds_up_health() -> None:
    app = _app(ServerLimits())  # the default limits
    with serving(app) as url:
        words = "W3 " * 2_000_000  # 6 MB: under the 8 MiB default, far over the context
        big = threading.Thread(target=lambda: out.append(_chat(url, words)))
        out: list[httpx.Response] = []
        big.start()
        worst = 0.0
        while big.is_alive():
            start = time.monotonic()
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
            worst = max(worst, time.monotonic() - start)
            time.sleep(0.05)
        big.join()
        check_error("chat", out[0], 400, "context length")
        assert worst < 1.0, f"/health took {worst:.2f} s while a large request was prepared"
        still_serving(url)


def test_metrics_add_up_against_a_mixed_load(server) -> None:  # type: ignore[no-untyped-def]
    url, state = server
    wait_idle(state)
    before = scrape(url)
    sent: Counter[tuple[str, str]] = Counter()
    jobs = []
    for i in range(24):
        kind = i % 4
        if kind == 0:
            jobs.append((("chat", "200"), "post", PATHS["chat"], good("chat", max_tokens=3)))
        elif kind == 1:
            jobs.append((("messages", "400"), "post", PATHS["messages"], good("messages", max_tokens=-1)))
        elif kind == 2:
            body = good("responses", padding="x" * LIMITS.max_body_bytes)
            jobs.append((("responses", "413"), "post", PATHS["responses"], body))
        else:
            jobs.append((("none", "404"), "get", "/v1/nope", None))

    def send(job):  # type: ignore[no-untyped-def]
        key, method, path, body = job
        r = httpx.request(method, f"{url}{path}", json=body, timeout=60)
        assert str(r.status_code) == key[1], r.text
        return key, r

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, jobs))
    sent.update(key for key, _ in results)
    after = scrape(url)
    for (endpoint, status), n in sent.items():
        key = f'dsgraph_requests_total{{endpoint="{endpoint}",status="{status}"}}'
        assert after.get(key, 0) - before.get(key, 0) == n, key
    total = sum(v for k, v in after.items() if k.startswith("dsgraph_requests_total"))
    assert total - sum(v for k, v in before.items() if k.startswith("dsgraph_requests_total")) == len(jobs)
    generated = sum(r.json()["usage"]["completion_tokens"] for (e, _), r in results if e == "chat")
    delta = after["dsgraph_generation_tokens_total"] - before["dsgraph_generation_tokens_total"]
    assert delta == generated


def test_sigterm_drains_requests_in_flight_then_closes_half_sent_connections() -> None:
    app = _app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    srv = DrainingServer(config, app.state.server.drain)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    lines: list[str] = []

    def stream() -> None:
        body = good("chat", stream=True, max_tokens=20, ignore_eos=True, temperature=0)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
            lines.extend(r.iter_lines())

    reader = threading.Thread(target=stream)
    reader.start()
    half = socket.create_connection(sock.getsockname(), timeout=10)
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{")
    while not lines:
        time.sleep(0.01)
    start = time.monotonic()
    srv.handle_exit(15, None)  # what SIGTERM does
    thread.join(10)
    reader.join(10)
    assert not thread.is_alive() and time.monotonic() - start < 9
    assert app.state.server.drain.draining
    assert [line for line in lines if line][-1] == "data: [DONE]"  # the stream in flight finished in full
    # the half-sent request is cancelled (uvicorn answers 500 for the app that never responded) and its
    # connection closed
    answer = b""
    while chunk := half.recv(4096):
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 500"), answer
    half.close()
    app.state.server.close()


def test_max_model_len_above_the_model_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"EngineConfig.max_model_len = 8192: expected at most 4096"):
        Engine(default_model_dir(), EngineConfig.from_flat(max_model_len=8192))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
_FIELDS = [
    "model",
    "messages",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "temperature",
    "top_p",
    "seed",
    "stream",
    "stop",
    "logprobs",
    "top_logprobs",
    "n",
    "tools",
    "system",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    api=st.sampled_from(list(PATHS)),
    fields=st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=5),
    keep_good=st.booleans(),
)
def test_random_bodies_get_a_2xx_or_4xx_in_the_protocols_shape(server, api, fields, keep_good) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = {**(good(api, max_tokens=2) if keep_good else {}), **fields}
    text = json.dumps(body, allow_nan=True)
    r = httpx.post(f"{url}{PATHS[api]}", content=text.encode(), timeout=60)
    if r.status_code == 200:
        if r.headers["content-type"].startswith("text/event-stream"):
            assert "data:" in r.text
        return
    assert 400 <= r.status_code < 500, r.text
    check_error(api, r, r.status_code)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_the_server_serves_after_the_random_bodies(server) -> None:  # type: ignore[no-untyped-def]
    url, state = server
    wait_idle(state)
    still_serving(url)
    assert MESSAGES


def test_drain_waits_for_requests_within_the_grace_period_then_cancels_the_rest() -> None:
    from dsgraph.runtime.server.lifecycle import Drain

    async def run() -> None:
        drain = Drain()

        async def request(seconds: float) -> None:
            drain.track()  # in flight until this task ends
            await asyncio.sleep(seconds)

        fast, slow = asyncio.create_task(request(0.05)), asyncio.create_task(request(30))
        await asyncio.sleep(0)
        assert drain.in_flight == 2 and not drain.draining
        assert await drain.drain(0.5) == 1  # the slow one was cancelled, the fast one finished
        assert drain.draining and fast.done() and not fast.cancelled()
        with contextlib.suppress(asyncio.CancelledError):
            await slow
        assert slow.cancelled() and drain.in_flight == 0

    asyncio.run(run())
