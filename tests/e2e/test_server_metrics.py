"""The server's view of the engine on a fresh tiny-model server (so counters start at zero): latency
histograms and cache-usage gauges, per-request prompt-cache hits in `usage`, a non-streaming client that
leaves, and a model step that fails. A gate in front of the model step holds the engine mid-request where
a test must look at it then."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx2 as httpx  # the HTTP client the `openai` package ships on
import pytest

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import FORCED_FIELD, create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import held_pages, scrape, serving, wait_idle

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
MODEL = "tiny-metrics"
PAGE_SIZE = 16
MESSAGES = [{"role": "user", "content": "W3 W5 W7"}]  # 3 prompt tokens (see test_server.py)
FORCED = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]  # ordinary words of the tiny vocabulary, never EOS


class Gate:
    """Wraps the engine's model step: `hold(k)` lets k more steps run, then blocks the engine thread
    until `release()`; `fail_next()` makes the next step raise."""

    def __init__(self, engine: Engine) -> None:
        self._run: Callable[[Any], Any] = engine.session.run
        self._open, self._left, self._fail = threading.Event(), 0, False
        self._open.set()
        engine.session.run = self  # type: ignore[method-assign]

    def __call__(self, inputs: Any, fix: Any = None) -> Any:
        if self._fail:
            self._fail = False
            raise RuntimeError("model step failed (test)")
        if not self._open.is_set():
            if self._left == 0:
                assert self._open.wait(20), "the gate was never released"
            else:
                self._left -= 1
        return self._run(inputs, fix)

    def hold(self, steps: int) -> None:
        self._left = steps
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def fail_next(self) -> None:
        self._fail = True


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=256, max_num_seqs=4, page_size=PAGE_SIZE))
    gate = Gate(engine)
    app = create_app(engine, MODEL, recipe_tokenizer(root), allow_forced_outputs=True)
    with serving(app) as url:
        yield url, app.state.server, gate


def _client(url: str):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _wait_for(url: str, series: str, value: float) -> dict[str, float]:
    import time

    deadline = time.time() + 20
    while (metrics := scrape(url)).get(series, 0.0) != value:
        assert time.time() < deadline, (series, metrics.get(series), value)
        time.sleep(0.02)
    return metrics


TTFT = "dsgraph_time_to_first_token_seconds_count"
ITL = "dsgraph_inter_token_latency_seconds_count"
GEN = "dsgraph_generation_tokens_total"


def test_latency_histograms_count_requests_and_tokens(server) -> None:  # type: ignore[no-untyped-def]
    url, _, _ = server
    before = scrape(url)
    client = _client(url)
    completions = []
    for i, max_tokens in enumerate((1, 3, 6)):
        out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=max_tokens, seed=i)
        completions.append(out.usage.completion_tokens)
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    completions += [c.usage.completion_tokens for c in stream if c.usage]
    after = scrape(url)
    # one first token per request, then one gap per further token
    assert after[TTFT] - before[TTFT] == 4
    assert after[ITL] - before[ITL] == sum(completions) - 4
    assert after[GEN] - before[GEN] == sum(completions)
    assert (
        after["dsgraph_time_to_first_token_seconds_sum"] > before["dsgraph_time_to_first_token_seconds_sum"]
    )
    assert after['dsgraph_time_to_first_token_seconds_bucket{le="+Inf"}'] == after[TTFT]


def test_cache_usage_rises_while_a_request_runs_and_returns_to_baseline(server) -> None:  # type: ignore[no-untyped-def]
    url, state, gate = server
    wait_idle(state)
    base = _wait_for(url, "dsgraph_state_slots_used", 0)  # usage and slots are published together
    assert base["dsgraph_kv_cache_usage"] == 0
    assert base["dsgraph_state_slots_total"] == 4
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": len(FORCED),
        "stream": True,
        FORCED_FIELD: FORCED,
    }
    gate.hold(2)  # prefill and one decode step, then the engine waits with the request in it
    reader = threading.Thread(target=lambda: httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30))
    reader.start()
    try:
        _wait_for(url, GEN, base[GEN] + 2)
        mid = _wait_for(url, "dsgraph_state_slots_used", 1)
    finally:
        gate.release()
    reader.join(30)
    engine = state.loop.engine
    ratios = list(held_pages(engine))
    num_pages = sum(engine.scheduler.page_usage(r).total for r in ratios)
    assert mid["dsgraph_num_requests_running"] == 1
    # 3 prompt + 2 generated tokens: one page of each ratio (a page holds PAGE_SIZE entries)
    assert mid["dsgraph_kv_cache_usage"] == pytest.approx(len(ratios) / num_pages)
    wait_idle(state)
    _wait_for(url, GEN, base[GEN] + len(FORCED))
    end = _wait_for(url, "dsgraph_state_slots_used", 0)
    assert end["dsgraph_kv_cache_usage"] == 0 and end["dsgraph_num_requests_running"] == 0


def _long_prompt(tag: int) -> str:
    return " ".join(f"W{(tag * 37 + i) % 250}" for i in range(150))


def test_usage_reports_prompt_tokens_served_from_the_prefix_cache(server) -> None:  # type: ignore[no-untyped-def]
    url, state, _ = server
    client, engine = _client(url), state.loop.engine
    messages = [{"role": "user", "content": _long_prompt(1)}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert first.usage.prompt_tokens == 150
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    hits_before = engine.prefix_cache_stats()[1]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= 150 and cached % PAGE_SIZE == 0, cached
    # the per-request count agrees with the scheduler's own running total
    assert engine.prefix_cache_stats()[1] - hits_before == cached

    resp = client.responses.create(model=MODEL, input=_long_prompt(1), max_output_tokens=2)
    assert resp.usage.input_tokens == 150 and resp.usage.input_tokens_details.cached_tokens == cached
    msg = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0).messages.create(
        model=MODEL, messages=messages, max_tokens=2
    )
    # Anthropic counts cache reads apart from input tokens
    assert msg.usage.cache_read_input_tokens == cached and msg.usage.input_tokens == 150 - cached

    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    (usage,) = [c.usage for c in stream if c.usage]
    assert usage.prompt_tokens_details.cached_tokens == cached


def test_non_streaming_client_that_leaves_aborts_its_request(server) -> None:  # type: ignore[no-untyped-def]
    url, state, gate = server
    wait_idle(state)
    base = scrape(url)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": len(FORCED), FORCED_FIELD: FORCED}
    gate.hold(2)  # the request cannot finish before the client gives up
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1.0)
        _wait_for(
            url,
            'dsgraph_requests_total{endpoint="chat",status="499"}',
            base.get('dsgraph_requests_total{endpoint="chat",status="499"}', 0.0) + 1,
        )
    finally:
        gate.release()
    wait_idle(state)
    assert set(held_pages(state.loop.engine).values()) == {0} and state.loop.engine.live == {}
    assert scrape(url)[GEN] - base[GEN] < len(FORCED)  # aborted, not run to its end
    ok = _client(url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_failed_model_step_fails_its_request_with_5xx_and_the_server_goes_on(server) -> None:  # type: ignore[no-untyped-def]
    url, state, gate = server
    gate.fail_next()
    with pytest.raises(openai.InternalServerError, match="model step failed"):
        _client(url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    wait_idle(state)
    assert set(held_pages(state.loop.engine).values()) == {0}
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    ok = _client(url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert ok.usage.prompt_tokens == 3


def test_an_engine_loop_that_keeps_failing_fails_each_request_instead_of_hanging() -> None:
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=64, max_num_seqs=2))

    def broken_step() -> list[object]:
        raise RuntimeError("engine bug (test)")

    engine.step = broken_step  # type: ignore[method-assign]
    app = create_app(engine, MODEL, recipe_tokenizer(root))
    with serving(app) as url:
        client = _client(url)
        with pytest.raises(openai.InternalServerError, match="engine bug"):
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        # the loop restarted: the next request runs (and fails the same way), nothing hangs
        r = httpx.post(
            f"{url}/v1/messages", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2}, timeout=10
        )
        assert r.status_code == 500, r.text
        assert r.json()["error"]["type"] == "api_error" and "engine bug" in r.json()["error"]["message"]
        assert app.state.server.loop.restarts == 2
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
