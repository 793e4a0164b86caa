"""Overlapped (zero-overhead) scheduling: token-for-token equal to plain steps on the tiny checkpoint
(greedy and seeded, stops of every kind, aborts, preemption, prefix hits, late arrivals), the plan of step
N+1 made and launched before step N's tokens are read, and no slot or page leaked."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import torch

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.engine_overlap import Flight
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.session import CacheBudgetError
from tests.oracle import model_fixtures as fx

PROMPTS = [fx.prompt(500 + i, n) for i, n in enumerate([3, 17, 5, 30, 1, 12, 8, 24])]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
BASE: dict[str, Any] = {"max_model_len": 256, "enable_prefix_cache": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def llms(model_dir) -> dict[str, LLM]:  # type: ignore[no-untyped-def]
    return {ov: LLM(model_dir, overlap=ov, **BASE) for ov in ("off", "on")}


def _outputs(llm: LLM, prompts, params) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    outs = llm.generate(prompts, params)
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


def _assert_nothing_held(engine: Engine) -> None:
    n = engine.scheduler.native
    assert not engine.has_unfinished and not n.has_unresolved
    assert n.num_free_slots == n.config.num_slots
    for r in engine.scheduler.config.ratios:
        usage = engine.scheduler.page_usage(r)
        assert usage.used == usage.idle  # only idle prefix-cache pages stay referenced


def test_greedy_and_seeded_batches_equal_plain_steps(llms) -> None:  # type: ignore[no-untyped-def]
    assert llms["off"].engine.overlap is None and llms["on"].engine.overlap is not None
    seeded = [SamplingParams(temperature=1.0, seed=40 + i, max_tokens=7, ignore_eos=True) for i in range(8)]
    for prompts, params in ((PROMPTS[:1], GREEDY), (PROMPTS, GREEDY), (PROMPTS, seeded)):
        assert _outputs(llms["on"], prompts, params) == _outputs(llms["off"], prompts, params)
    _assert_nothing_held(llms["on"].engine)


def test_stops_mid_batch_discard_the_planned_row_and_free_everything(llms) -> None:  # type: ignore[no-untyped-def]
    plain = _outputs(llms["off"], PROMPTS, GREEDY)
    # request 1 stops on its 3rd token (a stop token, checked like eos), request 2 on a stop string,
    # request 3 by max_tokens, the rest run on
    stop_token = plain[1][0][2]
    assert stop_token not in plain[1][0][:2]
    text = plain[2][1]
    params = [GREEDY] * 8
    params[1] = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, stop_token_ids=(stop_token,))
    params[2] = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, stop=[text[2:4]])
    params[3] = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine = llms["on"].engine
    discarded: list[int] = []
    native = engine.scheduler.native

    class Watch:  # records stops reported while the stopped request's next step was already running
        def __getattr__(self, name: str) -> Any:
            return getattr(native, name)

        def advance_ahead(self, sampled: Any) -> Any:
            running = engine.overlap.flight
            events, plan = native.advance_ahead(sampled)
            rids = set() if running is None else set(running.plan.seq_rids.tolist())
            discarded.extend(rid for rid, _, fin, why in events if fin and why == "stop" and rid in rids)
            return events, plan

    engine.scheduler.native = Watch()
    llms["on"]._ids = itertools.count(100)  # prompt i is request 100 + i
    try:
        got = _outputs(llms["on"], PROMPTS, params)
    finally:
        engine.scheduler.native = native
    assert got == _outputs(llms["off"], PROMPTS, params)
    assert got[1][0] == plain[1][0][:3] and got[1][2] == "stop" and got[2][2] == "stop"
    assert len(got[3][0]) == 2 and got[3][2] == "length"
    assert 101 in discarded  # its row of the step after its stop was planned, run and dropped
    _assert_nothing_held(engine)


def test_plan_of_the_next_step_is_launched_before_the_tokens_are_read(llms, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    engine = llms["on"].engine
    log: list[tuple[str, int]] = []
    host, submit, native = Flight.host, engine.runner.submit, engine.scheduler.native

    def read(self: Flight) -> Any:
        log.append(("read", int(self.plan.step)))
        return host(self)

    class Plans:
        def __getattr__(self, name: str) -> Any:
            return getattr(native, name)

        def advance_ahead(self, sampled: Any) -> Any:
            events, plan = native.advance_ahead(sampled)
            log.append(("plan", int(plan.step)))
            return events, plan

    monkeypatch.setattr(Flight, "host", read)
    monkeypatch.setattr(
        engine.runner,
        "submit",
        lambda plan, fix=None: (log.append(("run", int(plan.step))), submit(plan, fix))[1],
    )
    monkeypatch.setattr(engine.scheduler, "native", Plans())
    llms["on"].generate(PROMPTS[:4], GREEDY)
    reads = [s for kind, s in log if kind == "read"]
    assert len(reads) >= 6
    for step in reads:
        if ("run", step + 1) in log:  # the next step was planned and launched before this one was read
            assert log.index(("plan", step + 1)) < log.index(("run", step + 1)) < log.index(("read", step))
    assert sum(("run", s + 1) in log for s in reads) >= len(reads) - 2  # all but the drain


def test_abort_mid_stream_and_late_arrivals(model_dir) -> None:  # type: ignore[no-untyped-def]
    def run(overlap: str, abort_after: int | None) -> dict[int, tuple[tuple[int, ...], str | None]]:
        engine = Engine(model_dir, EngineConfig.from_flat(overlap=overlap, **BASE))
        for rid in range(3):
            engine.add_request(rid, PROMPTS[rid], GREEDY)
        for k in range(4):
            engine.step()
            if k == 1:  # arrivals while the others decode
                for rid in range(3, 6):
                    engine.add_request(rid, PROMPTS[rid], GREEDY)
            if abort_after is not None and k == abort_after:
                engine.abort(1)
        while engine.has_unfinished:
            engine.step()
        _assert_nothing_held(engine)
        return {rid: (tuple(lv.tokens), lv.finish) for rid, lv in engine.live.items()}

    plain, on = run("off", None), run("on", None)
    assert on == plain
    aborted = run("on", 2)
    assert aborted[1][1] == "abort" and aborted[1][0] == plain[1][0][: len(aborted[1][0])]
    assert {r: v for r, v in aborted.items() if r != 1} == {r: v for r, v in plain.items() if r != 1}


def _holds_nothing(engine: Engine) -> bool:
    n, sched = engine.scheduler.native, engine.scheduler
    pages = [sched.page_usage(r) for r in sched.config.ratios]
    return n.num_free_slots == n.config.num_slots and all(u.used == u.idle for u in pages)


def test_an_engine_with_nothing_unfinished_holds_no_cache_even_mid_step(model_dir) -> None:  # type: ignore[no-untyped-def]
    """Every request aborted after each step k, plain and overlapped; a forced-token request joins late,
    so that the overlap loop also resolves a flight before a plain step. At each commit (the native
    calls that free caches), after the step's plan was taken: what a thread reading `has_unfinished`
    mid-step sees (the server's tests wait for idle so) must not be False while a cache is held."""
    forced = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, golden_token_ids=(7, 200, 7))
    windows = 0  # commits whose plan held caches of requests the scheduler no longer counts
    for overlap, abort_after in itertools.product(("off", "on"), range(4)):
        engine = Engine(model_dir, EngineConfig.from_flat(overlap=overlap, **BASE))
        native, bad = engine.scheduler.native, []

        def check(name: str, e: Engine = engine, n: Any = native, bad: list[str] = bad) -> Any:
            def call(*args: Any) -> Any:
                nonlocal windows
                if not n.has_unfinished and not _holds_nothing(e):
                    windows += 1
                    if not e.has_unfinished:
                        bad.append(name)
                return getattr(n, name)(*args)

            return call

        class Watch:
            def __getattr__(self, name: str, n: Any = native) -> Any:
                return check(name) if name in ("advance", "advance_ahead", "resolve") else getattr(n, name)

        engine.scheduler.native = Watch()
        engine.add_request(0, PROMPTS[0], GREEDY)
        for k in range(abort_after + 1):
            engine.step()
            if k == 0:
                engine.add_request(1, PROMPTS[1], forced)
        for rid in (0, 1):
            engine.abort(rid)
            engine.release(rid)
        while engine.has_unfinished:
            engine.step()
        assert bad == [], (overlap, abort_after, bad)
        engine.scheduler.native = native
        _assert_nothing_held(engine)
    assert windows > 0  # the aborts hit plans already made: their caches waited for a commit


def test_preemption_and_prefix_hits_equal_plain_steps(model_dir) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CacheBudgetError) as err:
        LLM(model_dir, max_model_len=64, cache_budget_bytes=1, enable_prefix_cache=False)
    need = int(re.search(r"needs (\d+) B", str(err.value)).group(1))  # pages for one 64-token request
    small = {"max_model_len": 64, "cache_budget_bytes": need, "enable_prefix_cache": False}
    outs = {}
    for ov in ("off", "on"):
        llm = LLM(model_dir, overlap=ov, **small)
        outs[ov] = _outputs(llm, PROMPTS, GREEDY)
        assert llm.engine.scheduler.native.num_preemptions > 0
        _assert_nothing_held(llm.engine)
    assert outs["on"] == outs["off"]
    shared = fx.prompt(600, 96)
    prompts = [shared + fx.prompt(601 + i, 7) for i in range(3)]
    hits = {}
    for ov in ("off", "on"):
        llm = LLM(model_dir, overlap=ov, max_model_len=256, prefix_replay="exact")
        hits[ov] = [_outputs(llm, [p], GREEDY)[0] for p in prompts] + _outputs(llm, prompts, GREEDY)
        assert llm.engine.prefix_cache_stats()[1] >= 5 * 96
        _assert_nothing_held(llm.engine)
    assert hits["on"] == hits["off"]


def test_prompt_logprobs_and_forced_tokens_switch_to_plain_steps(llms) -> None:  # type: ignore[no-untyped-def]
    params = [
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, golden_token_ids=(7, 200, 7)),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=0),
        GREEDY,
    ]
    got, want = (llms[ov].generate(PROMPTS[1:4], params) for ov in ("on", "off"))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert got[0].outputs[0].token_ids[:3] == (7, 200, 7)
    assert got[1].prompt_logprobs == want[1].prompt_logprobs and got[1].prompt_logprobs[1] is not None
    _assert_nothing_held(llms["on"].engine)


def test_overlap_on_the_cuda_platform_with_a_cpu_device(model_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The cuda platform's code paths (device session, in-place caches, captured steps, staged inputs and
    their on-device correction) on a cpu device, with the cpu rules in place of the Triton kernels
    (`target.DEFAULTS`: the kernels under Triton's interpreter take minutes per step); the kernels
    themselves are checked on the GPU (tests/cuda/test_overlap_gpu.py)."""
    import dsgraph.runtime.engine as engine_mod
    import dsgraph.runtime.session as session_mod
    from dsgraph.platform.cuda import target

    monkeypatch.setattr(target, "PLATFORM", target.DEFAULTS)
    monkeypatch.setattr(session_mod, "resolve_device", lambda d: torch.device("cpu"))
    monkeypatch.setattr(engine_mod, "resolve_device", lambda d: torch.device("cpu"))
    kw = {"platform": "cuda", "speculative": "off", "max_num_batched_tokens": 64, **BASE}
    plain = _outputs(
        LLM(model_dir, overlap="off", **kw),
        PROMPTS[:3],
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    )
    stop = plain[1][0][1]
    params = [
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, stop_token_ids=(stop,)),
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
    ]
    auto = LLM(model_dir, **kw)  # "auto" overlaps on the cuda platform
    assert auto.engine.overlap is not None
    got = _outputs(auto, PROMPTS[:3], params)
    assert got[0] == plain[0] and got[1][0] == plain[1][0][: plain[1][0].index(stop) + 1]
    assert got[2][0] == plain[2][0][:3] and auto.engine.session.captures > 0
    _assert_nothing_held(auto.engine)


def test_overlap_config_errors_name_the_field(model_dir) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(
        ValueError, match="EngineConfig.scheduler.overlap = 'yes': expected one of 'auto', 'on', 'off'"
    ):
        EngineConfig.from_flat(overlap="yes")
    drafting = Engine(
        model_dir,
        EngineConfig.from_flat(overlap="on", speculative="dspark", verify_schedule="fixed", max_model_len=64),
    )
    assert type(drafting.overlap).__name__ == "SpecOverlap"  # overlap with drafting on (spec_overlap.py)
    assert Engine(model_dir, EngineConfig.from_flat(max_model_len=64)).overlap is None  # auto: off on cpu
