"""The engine's side of the router: GET /load reports the load and POST /admin/drain drains (503 for new
requests, the requests in flight finish, streams to their last event, then the exit hook runs; 60 s of
grace by default); a bad grace_s is a 400 naming it, and /admin needs the --api-key."""

from __future__ import annotations

import asyncio
import time

import httpx2 as httpx

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import serving

MODEL = "tiny"


def _app(api_key: str | None = None):  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=128, max_num_seqs=4))
    return create_app(engine, MODEL, recipe_tokenizer(root), api_key=api_key)


def _body(tokens: int) -> dict:  # type: ignore[type-arg]
    return {"model": MODEL, "messages": [{"role": "user", "content": "W3 W4"}], "max_tokens": tokens}


def test_load_then_drain_finishes_in_flight_requests_and_runs_the_exit_hook() -> None:
    app = _app()
    drained: list[float] = []
    app.state.on_drained = lambda: drained.append(time.time())
    with serving(app) as url:
        idle = httpx.get(f"{url}/load").json()
        assert idle == {
            "running": 0,
            "waiting": 0,
            "kv_tokens": 0,
            "kv_usage": 0.0,
            "max_num_seqs": 4,
            "in_flight": 0,
            "draining": False,
            "healthy": True,
        }
        bad = httpx.post(f"{url}/admin/drain", json={"grace_s": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "grace_s"
        assert httpx.post(f"{url}/admin/drain?grace_s=abc").json()["error"]["param"] == "grace_s"

        async def scenario() -> tuple[list[httpx.Response], httpx.Response, dict, httpx.Response]:  # type: ignore[type-arg]
            async with httpx.AsyncClient(timeout=300) as client:
                running = [
                    asyncio.ensure_future(client.post(f"{url}/v1/chat/completions", json=_body(12)))
                    for _ in range(3)
                ]
                while (await client.get(f"{url}/load")).json()["kv_tokens"] == 0:
                    await asyncio.sleep(0.01)
                load = (await client.get(f"{url}/load")).json()
                drain = await client.post(f"{url}/admin/drain", json={"grace_s": 300})
                late = await client.post(f"{url}/v1/chat/completions", json=_body(2))
                return list(await asyncio.gather(*running)), drain, load, late

        done, drain, load, late = asyncio.run(scenario())
        assert load["running"] >= 1 and load["kv_tokens"] > 0
        assert drain.status_code == 202 and drain.json()["status"] == "draining"
        assert drain.json()["in_flight"] >= 1  # the drain began with requests still running
        assert late.status_code == 503  # a router sends it to another engine
        assert [r.status_code for r in done] == [200, 200, 200], [r.text for r in done]  # in flight: finished
        assert all(r.json()["usage"]["completion_tokens"] > 0 for r in done)
        deadline = time.time() + 10
        while not drained:
            assert time.time() < deadline, "the exit hook did not run"
            time.sleep(0.02)
        assert httpx.get(f"{url}/health").status_code == 503
        assert httpx.get(f"{url}/load").json()["draining"] is True


def test_a_drain_waits_for_each_stream_to_its_last_event() -> None:
    # a streaming handler returns its response at the first token; the stream is in flight until its
    # last event, so the exit hook runs only once every stream has ended (each with [DONE])
    app = _app()
    running_at_exit: list[int] = []
    app.state.on_drained = lambda: running_at_exit.append(app.state.server.loop.num_running)
    body = {**_body(24), "stream": True, "ignore_eos": True, "temperature": 0}
    with serving(app) as url:

        async def scenario() -> tuple[list[list[str]], httpx.Response]:
            async with httpx.AsyncClient(timeout=300) as client:
                started = [asyncio.Event() for _ in range(3)]

                async def one(i: int) -> list[str]:
                    lines = []
                    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            lines += [line] if line else []
                            started[i].set()
                    return lines

                streams = [asyncio.ensure_future(one(i)) for i in range(3)]
                await asyncio.gather(*(e.wait() for e in started))
                drain = await client.post(f"{url}/admin/drain")  # no grace_s: the default
                return list(await asyncio.gather(*streams)), drain

        streams, drain = asyncio.run(scenario())
        assert drain.status_code == 202 and drain.json()["grace_s"] == 60.0  # the one minute
        assert drain.json()["in_flight"] == 3  # the three streams, past their first token
        assert all(lines[-1] == "data: [DONE]" for lines in streams), streams
        deadline = time.time() + 10
        while not running_at_exit:
            assert time.time() < deadline, "the exit hook did not run"
            time.sleep(0.02)
        assert running_at_exit == [0]


def test_admin_needs_the_api_key() -> None:
    with serving(_app(api_key="k")) as url:
        assert httpx.post(f"{url}/admin/drain").status_code == 401
        assert httpx.get(f"{url}/load").status_code == 200  # open like /health and /metrics
        ok = httpx.post(f"{url}/admin/drain", json={"grace_s": 0}, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 202
