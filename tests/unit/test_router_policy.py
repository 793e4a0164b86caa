"""The router's policies without engines: the quadratic cost fit, chunk sizes for a time budget,
context buckets, decode placement balancing batch against KV length, prefix affinity, request
summaries, the check that a stream ended properly, the headers sent to a prompt engine, and the pool
noticing a dead engine while another is slow to answer its poll."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx2 as httpx
import numpy as np
import pytest

from dsgraph.runtime.router import pd
from dsgraph.runtime.router import policy as P
from dsgraph.runtime.router.config import RouterConfig
from dsgraph.runtime.router.cost import OnlineCost, QuadraticCost, fit_quadratic
from dsgraph.runtime.router.forward import route_open
from dsgraph.runtime.router.pool import EngineState, Pool
from dsgraph.runtime.router.routes import ROUTES, summarize
from dsgraph.runtime.router.select import Choice, Selector


def test_fit_recovers_a_quadratic_from_noisy_step_times() -> None:
    rng = np.random.default_rng(0)
    a, b, c = 0.02, 3e-5, 4e-10
    lengths = rng.integers(128, 200_000, size=400)
    times = a + b * lengths + c * lengths**2
    noisy = times * (1 + 0.02 * rng.standard_normal(len(times)))
    fit = fit_quadratic(zip(lengths.tolist(), noisy.tolist(), strict=True))
    assert fit.b == pytest.approx(b, rel=0.1) and fit.c == pytest.approx(c, rel=0.1)
    for length in (1_000, 50_000, 200_000):
        assert fit.time(length) == pytest.approx(a + b * length + c * length**2, rel=0.03)


def test_fit_keeps_every_coefficient_non_negative() -> None:
    # times that fall slightly with length: an unconstrained fit gives a negative slope
    samples = [(100.0, 1.0), (200.0, 0.99), (300.0, 0.985), (400.0, 0.98)]
    fit = fit_quadratic(samples)
    assert min(fit.a, fit.b, fit.c) >= 0
    assert fit.a == pytest.approx(np.mean([t for _, t in samples]), rel=0.01)  # the constant alone
    with pytest.raises(ValueError, match="at least 3"):
        fit_quadratic([(1.0, 1.0)])


def test_online_cost_refits_after_enough_distinct_lengths() -> None:
    prior = QuadraticCost(1.0, 0.0, 0.0)
    online = OnlineCost(prior, refit_every=8)
    for k in range(16):
        length = 1000 * (k % 4 + 1)
        online.observe(length, 0.01 + 1e-5 * length)
    assert online.model != prior and online.model.b == pytest.approx(1e-5, rel=1e-3)
    online.observe(10, float("nan"))  # ignored
    assert online.num_samples == 16


@pytest.mark.parametrize("start", [0, 4096, 100_000])
def test_chunk_fills_the_budget_and_no_more(start: int) -> None:
    cost = QuadraticCost(0.01, 2e-5, 1e-10)
    n = cost.chunk_for_budget(start, 10**7, 0.25, 1)
    assert cost.chunk_time(start, n) <= 0.25 < cost.chunk_time(start, n + 1)


def test_chunks_cover_the_prompt_and_shrink_as_the_context_grows() -> None:
    cost = QuadraticCost(0.01, 2e-5, 1e-9)
    chunks = P.plan_chunks(300_000, cost, 0.25, 256)
    assert sum(chunks) == 300_000
    assert all(x >= y for x, y in zip(chunks[:-2], chunks[1:-1], strict=True))  # the last is the rest
    assert chunks[0] > chunks[-2]
    assert P.plan_chunks(100, cost, 0.25, 256) == (100,)
    # a budget below the fixed cost still makes progress, at the minimum chunk
    assert P.plan_chunks(1000, QuadraticCost(1.0, 0.0, 0.0), 0.25, 256) == (256, 256, 256, 232)


def test_context_buckets_are_deepseeks() -> None:
    bounds = RouterConfig(normal=("http://a:1",)).context_buckets
    got = [P.context_bucket(t, bounds) for t in (1, 16383, 16384, 65535, 65536, 262143, 262144, 10**6)]
    assert got == [0, 0, 1, 1, 2, 2, 3, 3]


def test_decode_weighs_batch_against_kv_length() -> None:
    many_short = P.Candidate("a", batch=10, kv_tokens=1_000)
    few_long = P.Candidate("b", batch=2, kv_tokens=60_000)
    # 60K KV tokens cost about 15 sequences at 4096 per sequence: the busier batch is the cheaper
    assert P.choose_decode([many_short, few_long], 100, kv_per_seq=4096) == 0
    # where attention is cheap (a large kv_per_seq) the batch size decides
    assert P.choose_decode([many_short, few_long], 100, kv_per_seq=1e6) == 1
    full = P.Candidate("c", batch=4, kv_tokens=0, max_batch=4)
    assert P.choose_decode([full, few_long], 100, kv_per_seq=4096) == 1
    assert P.choose_decode([full], 100, kv_per_seq=4096) == 0  # all full: still placed
    idle = [P.Candidate("a"), P.Candidate("b"), P.Candidate("c")]
    assert [P.choose_decode(idle, 10, 4096, turn) for turn in range(4)] == [0, 1, 2, 0]  # ties rotate


def _place(policy: str, requests: list[int], engines: int) -> np.ndarray:
    """(batch, kv) per engine after placing `requests` (context lengths) with a policy."""
    load = np.zeros((engines, 2))
    for k, tokens in enumerate(requests):
        cands = [P.Candidate(str(i), int(b), int(kv)) for i, (b, kv) in enumerate(load)]
        i = k % engines if policy == "round_robin" else P.choose_decode(cands, tokens, 4096)
        load[i] += (1, tokens)
    return load


def test_balanced_placement_of_a_skewed_mix_beats_round_robin() -> None:
    # every other request is long: round robin puts every long one on the same engine
    requests = [30_000 if k % 2 == 0 else 200 for k in range(400)]
    rr, bal = _place("round_robin", requests, 2), _place("balanced", requests, 2)
    cost = lambda load: load[:, 0] + load[:, 1] / 4096  # noqa: E731
    assert cost(rr).max() / cost(rr).mean() > 1.7  # of at most 2 with two engines
    assert cost(bal).max() / cost(bal).mean() < 1.02


def test_round_robin_of_pairs_goes_round_both_roles() -> None:
    urls = [f"http://127.0.0.1:{p}" for p in range(9001, 9005)]
    cfg = RouterConfig(prefill=tuple(urls[:2]), decode=tuple(urls[2:]), policy="round_robin")
    pool = Pool(cfg, None)  # type: ignore[arg-type]  # no polls here: the engines are marked up
    for e in pool.engines:
        e.healthy = True
    selector = Selector(cfg, pool)
    pairs = [(c.prefill.url, c.engine.url) for c in (selector.choose(10, "") for _ in range(4))]  # type: ignore[union-attr]
    assert {p for p, _ in pairs} == set(urls[:2]) and {d for _, d in pairs} == set(urls[2:]), pairs


def test_prefill_goes_where_it_finishes_first() -> None:
    cost = QuadraticCost(0.01, 2e-5, 1e-10)
    busy, idle = P.Candidate("a", backlog_s=5.0), P.Candidate("b", backlog_s=0.5)
    plan = P.choose_prefill([busy, idle], 40_000, cost, (16384, 65536, 262144), 0.25, 256)
    assert plan.index == 1 and plan.bucket == 1 and sum(plan.chunks) == 40_000
    starts = np.cumsum((0,) + plan.chunks[:-1])
    assert plan.seconds == pytest.approx(
        sum(cost.chunk_time(int(s), n) for s, n in zip(starts, plan.chunks, strict=True))
    )


def test_rendezvous_moves_only_the_keys_of_a_removed_engine() -> None:
    cands = [P.Candidate(f"http://e{i}:1") for i in range(8)]
    keys = [f"prefix-{k}" for k in range(400)]
    before = {k: cands[P.rendezvous(k, cands)].name for k in keys}
    fewer = cands[:3] + cands[4:]
    after = {k: fewer[P.rendezvous(k, fewer)].name for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == cands[3].name} and moved


def test_affinity_yields_to_balance_beyond_its_slack() -> None:
    light, heavy = P.Candidate("a", batch=4), P.Candidate("b", batch=5)
    assert P.with_affinity(0, 1, [light, heavy], 10, 4096, slack=0.25) == 1  # 6 <= 5 * 1.25
    assert P.with_affinity(0, 1, [light, P.Candidate("b", batch=9)], 10, 4096, slack=0.25) == 0


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("engines", {}),
        ("prefill/decode", {"prefill": ("http://a:1",)}),
        ("normal", {"normal": ("localhost:8000",)}),
        ("policy", {"normal": ("http://a:1",), "policy": "fastest"}),
        ("poll_interval_s", {"normal": ("http://a:1",), "poll_interval_s": 0}),
        ("max_attempts", {"normal": ("http://a:1",), "max_attempts": 0}),
        ("context_buckets", {"normal": ("http://a:1",), "context_buckets": (10, 5)}),
    ],
)
def test_config_errors_name_the_field(field: str, kw: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=field):
        RouterConfig(**kw)


def test_summary_estimates_prompt_tokens_from_every_protocol() -> None:
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 400}]}], "stream": True}
    s = summarize(json.dumps(chat).encode(), 4.0)
    assert s.stream and s.tokens == 100 and s.prefix.startswith("xxx")
    msgs = {"system": "s" * 40, "messages": [{"role": "user", "content": "y" * 40}]}
    assert summarize(json.dumps(msgs).encode(), 4.0).tokens == 20  # 81 characters with the separator
    assert summarize(json.dumps({"prompt": [[1, 2, 3], [4, 5]]}).encode(), 4.0).tokens == 5
    assert summarize(b"not json", 4.0) == summarize(b"[1]", 4.0)  # forwarded: the engine names the error
    assert not summarize(json.dumps({"stream": "yes"}).encode(), 4.0).stream


def test_a_stream_counts_as_ended_only_after_its_final_or_error_event() -> None:
    chat, messages = ROUTES[0], ROUTES[2]
    assert not route_open(chat, b'data: {"a": 1}\n\ndata: [DONE]\n\n')
    assert route_open(chat, b'data: {"text": "data: [DONE]"}\n\n')  # the marker inside content is not the end
    assert not route_open(chat, b'data: {"a": 1}\n\ndata: {"error": {"message": "x"}}\n\n')
    assert not route_open(messages, b"event: message_stop\ndata: {}\n\n")
    assert route_open(messages, b"event: content_block_delta\ndata: {}\n\n")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["router"], "engines"),
        (["router", "--normal", "localhost:1"], "normal"),
        (["router", "--normal", "http://a:1", "--prefill-cost", "1,2"], "prefill_cost"),
        (["router", "--normal", "http://a:1", "--prefill-cost", "1,-2,0"], "prefill_cost"),
    ],
)
def test_router_command_refuses_a_bad_option_in_one_line(argv: list[str], field: str, capsys) -> None:  # type: ignore[no-untyped-def]
    from dsgraph.tools.cli import main

    assert main(argv) == 2
    assert field in capsys.readouterr().err


def test_pd_headers_name_the_completion_engine_and_a_chunk_only_when_the_prompt_needs_several() -> None:
    prompt, completion = EngineState("http://p:1", "prefill"), EngineState("http://c:2", "decode")
    several = Choice(completion, prompt, P.PrefillPlan(0, 0, (10, 9, 9), 0.1))
    assert pd.target(several) is prompt
    assert pd.headers(several) == {pd.DECODE_URL_HEADER: "http://c:2", pd.PREFILL_CHUNK_HEADER: "10"}
    one = Choice(completion, prompt, P.PrefillPlan(0, 0, (40,), 0.1))
    assert pd.headers(one) == {pd.DECODE_URL_HEADER: "http://c:2"}  # the estimate fits one step
    normal = Choice(completion, None, P.PrefillPlan(0, 0, (10, 9), 0.1))
    assert pd.target(normal) is completion and pd.headers(normal) == {}


def test_a_dead_engine_leaves_the_pool_while_another_is_slow_to_answer() -> None:
    load = {"running": 0, "waiting": 0, "kv_tokens": 0, "draining": False, "healthy": True}
    gone = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if gone.is_set() and request.url.host == "dead":
            raise httpx.ConnectError("refused", request=request)
        if gone.is_set():  # a busy engine: its /load answers after 2 s
            await asyncio.sleep(2)
        return httpx.Response(200, json=load)

    async def run() -> tuple[bool, bool]:
        cfg = RouterConfig(normal=("http://slow:1", "http://dead:2"), poll_interval_s=0.05, poll_timeout_s=5)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            pool = Pool(cfg, client)
            await pool.poll_all()
            slow, dead = pool.engines
            assert slow.healthy and dead.healthy
            gone.set()
            poller = asyncio.create_task(pool.run())
            await asyncio.sleep(0.5)  # 2 failed polls of the dead engine fit, not one answer of the slow
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            return slow.healthy, dead.healthy

    assert asyncio.run(run()) == (True, False)
