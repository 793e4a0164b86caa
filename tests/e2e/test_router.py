"""`dsgraph router` in front of two `dsgraph serve` engines on loopback (tiny model, CPU): 200 concurrent
streams with none lost and the tokens of a single engine (greedy), batch and KV balance under a skewed
load, the other endpoints forwarded unchanged, drain during load, SIGKILL of an engine during load
(each affected request completes elsewhere or ends with an error event), and rejoining."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest

from tests.e2e.router_util import (
    MODEL,
    Deployment,
    EngineProcess,
    RouterProcess,
    chat_body,
    router,
    run_streams,
    wait_rejoined,
)

pytestmark = pytest.mark.slow


PROMPTS = [" ".join(f"W{(k * 7 + j) % 90 + 10}" for j in range(3 + k % 5)) for k in range(10)]
TOKENS = (4, 8, 16)  # the max_tokens the tests use


def _long_prompt(words: int) -> str:
    return " ".join(f"W{j % 90 + 10}" for j in range(words))


@pytest.fixture(scope="module")
def dep() -> Iterator[Deployment]:
    """The README's two engines, started; each test starts the README's router over them."""
    d = Deployment()
    for e in d.engines:
        e.start()
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda e: e.wait_healthy(), d.engines))
        yield d
    finally:
        for e in d.engines:
            e.stop()


@pytest.fixture(scope="module")
def engines(dep: Deployment) -> list[EngineProcess]:
    return dep.engines


@pytest.fixture(scope="module")
def alone(engines) -> dict[tuple[int, int], str]:  # type: ignore[no-untyped-def]
    """What one engine answers alone, per (prompt, max_tokens): the reference for routed streams."""
    keys = [(p, n) for p in range(len(PROMPTS)) for n in TOKENS]
    results = run_streams(engines[0].url, [chat_body(PROMPTS[p], n) for p, n in keys])
    assert all(r.ok for r in results)
    return {k: r.text for k, r in zip(keys, results, strict=True)}


def _bodies(count: int, tokens: int) -> list[dict]:  # type: ignore[type-arg]
    return [chat_body(PROMPTS[k % len(PROMPTS)], tokens) for k in range(count)]


def _served(url: str) -> float:
    """Chat requests the engine answered 200 (its own /metrics)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if (
            line.startswith("dsgraph_requests_total{")
            and 'endpoint="chat"' in line
            and 'status="200"' in line
        ):
            return float(line.split()[-1])
    return 0.0


def _rejoins_and_serves(r: RouterProcess, engine: EngineProcess) -> None:
    engine.start()
    engine.wait_healthy()
    wait_rejoined(r, engine.url)
    before = _served(engine.url)
    assert all(x.ok for x in run_streams(r.url, _bodies(12, 2)))
    assert _served(engine.url) - before >= 3  # the engine takes its share again


def test_200_streams_none_lost_same_tokens_as_one_engine(dep, engines, alone) -> None:  # type: ignore[no-untyped-def]
    before = [_served(e.url) for e in engines]
    with router(dep) as r:
        routed = run_streams(r.url, _bodies(200, 4))
    lost = [k for k, x in enumerate(routed) if not x.ok]
    assert not lost, [routed[k] for k in lost[:3]]
    assert [x.text for x in routed] == [alone[k % len(PROMPTS), 4] for k in range(200)]
    share = [_served(e.url) - b for e, b in zip(engines, before, strict=True)]
    assert sum(share) == 200 and min(share) >= 60, share  # both engines served, neither starved


def test_skewed_load_balances_batch_and_kv(dep, engines) -> None:  # type: ignore[no-untyped-def]
    # one request in four has a 100-word prompt: round robin over 2 engines would give one engine all
    bodies = [chat_body(_long_prompt(100) if k % 4 == 0 else PROMPTS[k % 10], 12) for k in range(32)]
    samples: list[tuple[list[int], dict]] = []  # type: ignore[type-arg]
    # a tiny model's sequence is about 10 tokens: 64 KV tokens weigh one sequence (a 100-word prompt
    # about 1.6), so KV counts in the placement (the default 4096 suits a real model's contexts)
    with router(dep, "--kv-per-seq", "64") as r:

        async def sample(tasks) -> None:  # type: ignore[no-untyped-def]
            async with httpx.AsyncClient() as client:
                while not all(t.done() for t in tasks):
                    # requests each engine's HTTP server has open (its own count), and the router's pool
                    open_ = [(await client.get(f"{e.url}/load")).json()["in_flight"] for e in engines]
                    if sum(open_) >= 16:  # the load is on, not ramping up or draining away
                        samples.append((open_, r.engines()))
                    await asyncio.sleep(0.02)

        results = run_streams(r.url, bodies, during=sample)
    assert all(x.ok for x in results)
    assert len(samples) >= 3, len(samples)
    batch = [sum(s[0][i] for s in samples) / len(samples) for i in range(2)]
    # KV: the prompt tokens (estimated from the text) plus the events streamed, of the requests open there
    kv = [sum(s[1][e.url]["local_kv_tokens"] for s in samples) / len(samples) for e in engines]
    # tolerances, time-averaged over the loaded samples: requests open within 25% of the pair's mean;
    # KV within 50% (the 8 long prompts hold most of it, one misplaced shifts it by about a fifth; round
    # robin puts all 8 on one engine, about 80% over the mean)
    for what, mean, tolerance in (("requests open", batch, 1.25), ("KV tokens", kv, 1.5)):
        assert max(mean) <= tolerance * sum(mean) / 2, (what, mean)


def _text(answer: dict) -> str:  # type: ignore[type-arg]
    """The text of a Messages or a completions answer."""
    return answer["content"][0]["text"] if "content" in answer else answer["choices"][0]["text"]


def test_messages_and_completions_are_forwarded_unchanged(dep, engines) -> None:  # type: ignore[no-untyped-def]
    msg = {
        "model": MODEL,
        "max_tokens": 6,
        "temperature": 0,
        "messages": [{"role": "user", "content": "W3 W4"}],
    }
    comp = {"model": MODEL, "prompt": "W5 W6", "max_tokens": 6, "temperature": 0}
    direct = engines[1].url
    with router(dep) as r:
        url = r.url
        for path, body in (("/v1/messages", msg), ("/v1/completions", comp)):
            via, ref = (
                httpx.post(f"{url}{path}", json=body, timeout=60),
                httpx.post(f"{direct}{path}", json=body, timeout=60),
            )
            assert via.status_code == ref.status_code == 200
            assert _text(via.json()) == _text(ref.json())
        streamed = httpx.post(f"{url}/v1/messages", json={**msg, "stream": True}, timeout=60)
        assert streamed.text.rstrip().rsplit("\n\n", 1)[-1].startswith("event: message_stop")
        bad = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": "x"}, timeout=60)
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]  # the engine's error
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert "dsgraph_router_requests_total" in httpx.get(f"{url}/metrics").text
        assert len(httpx.get(f"{url}/engines").json()["engines"]) == 2


def test_drain_during_load_loses_nothing_then_the_engine_rejoins(dep, engines, alone) -> None:  # type: ignore[no-untyped-def]
    a = engines[0]
    with router(dep) as r:

        async def drain_a(tasks) -> None:  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient() as client:
                resp = await client.post(f"{a.url}/admin/drain", json={"grace_s": 30})
            assert resp.status_code == 202 and resp.json()["status"] == "draining"

        results = run_streams(r.url, _bodies(40, 8), during=drain_a)
        assert all(x.ok for x in results), [x for x in results if not x.ok][:3]
        assert [x.text for x in results] == [alone[k % len(PROMPTS), 8] for k in range(40)]
        assert a.proc is not None and a.proc.wait(40) == 0  # it exited once its requests were done
        _rejoins_and_serves(r, a)


def test_kill_9_during_load_every_request_completes_or_errors(dep, engines, alone) -> None:  # type: ignore[no-untyped-def]
    b = engines[1]
    with router(dep) as r:

        async def kill_b(tasks) -> None:  # type: ignore[no-untyped-def]
            deadline = time.time() + 60
            # kill while some of b's streams have begun and others still wait for their first token
            while not (
                (e := r.engines()[b.url])["awaiting_first"] >= 1 and e["in_flight"] > e["awaiting_first"]
            ):
                assert time.time() < deadline, "the load never reached engine b"
                await asyncio.sleep(0.005)
            b.kill()

        results = run_streams(r.url, _bodies(48, 16), during=kill_b)
        errors = [x for x in results if not x.ok]
        for k, x in enumerate(results):
            if x.ok:  # completed here or elsewhere, with the same tokens
                assert x.text == alone[k % len(PROMPTS), 16]
            else:  # began on the killed engine: an error event after its tokens, never a silent end
                assert x.status == 200 and x.error is not None and x.chunks > 0, x
                assert "incomplete" in x.error["error"]["message"]
        assert errors, "the kill hit no stream in progress"
        assert r.metric("dsgraph_router_retries_total") >= 1  # queued ones went to the other engine
        assert all(x.ok for x in run_streams(r.url, _bodies(6, 2)))
        _rejoins_and_serves(r, b)
