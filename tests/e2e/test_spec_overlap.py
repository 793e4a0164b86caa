"""Zero-overhead scheduling with DSpark drafting on (runtime/spec_overlap.py), tiny checkpoint with DSpark
stages: token-for-token (and logprob-for-logprob) equal to the plain drafting engine, greedy and seeded
(exact and deterministic verification), with stop strings, stop tokens and an abort mid-run; step N+1
is submitted before step N's events are made; nothing is left held."""

from __future__ import annotations

from typing import Any

import pytest

from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.spec_overlap import SpecOverlap
from tests.e2e.test_overlap import _assert_nothing_held
from tests.oracle import model_fixtures as fx
from tests.runtime.test_spec_engine import CURVE

PROMPTS = [fx.prompt(960 + i, n) for i, n in enumerate([3, 11, 6, 17])]
# The confidence planner's curve is corrected from measured step times, so its plans (and with them a
# sampled request's tokens under exact verification, and the draft counts) follow timing, with overlap
# or without. The fixed schedule, drafting every step, makes every plan timing-free: there everything
# is compared; under the confidence schedule greedy tokens are (they never depend on the plan).
BASE: dict[str, Any] = dict(
    max_model_len=96,
    speculative="dspark",
    verify_schedule="fixed",
    throughput_curve=CURVE,
    draft_cost=((1, 2, 4, 8), (0.5, 0.5, 0.5, 0.5)),
    draft_pause=False,
    enable_prefix_cache=False,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def llms(model_dir) -> dict[str, LLM]:  # type: ignore[no-untyped-def]
    return {ov: LLM(model_dir, overlap=ov, **BASE) for ov in ("off", "on")}


def _outputs(llm: LLM, params: Any) -> list[tuple[Any, ...]]:
    outs = llm.generate(PROMPTS, params)
    return [
        (c.token_ids, c.text, c.finish_reason, c.logprobs, c.num_draft_tokens, c.num_accepted_tokens)
        for c in (o.outputs[0] for o in outs)
    ]


def test_greedy_and_seeded_equal_the_plain_drafting_engine(llms) -> None:  # type: ignore[no-untyped-def]
    assert llms["off"].engine.overlap is None and isinstance(llms["on"].engine.overlap, SpecOverlap)
    greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2)
    seeded = [SamplingParams(temperature=0.9, seed=3 + i, max_tokens=8, ignore_eos=True) for i in range(4)]
    for params in (greedy, seeded):
        assert _outputs(llms["on"], params) == _outputs(llms["off"], params)
    assert llms["on"].engine.spec_stats()["verified_tokens"] > 0  # type: ignore[index]
    _assert_nothing_held(llms["on"].engine)


def test_confidence_schedule_greedy_equals_plain(model_dir) -> None:  # type: ignore[no-untyped-def]
    greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    kw = {**BASE, "verify_schedule": "confidence"}
    got = {ov: _outputs(LLM(model_dir, overlap=ov, **kw), greedy) for ov in ("off", "on")}
    assert [g[:3] for g in got["on"]] == [g[:3] for g in got["off"]]


def test_deterministic_seeded_equals_plain(model_dir) -> None:  # type: ignore[no-untyped-def]
    seeded = [SamplingParams(temperature=1.0, seed=50 + i, max_tokens=7, ignore_eos=True) for i in range(4)]
    got = {
        ov: _outputs(LLM(model_dir, overlap=ov, deterministic=True, **BASE), seeded) for ov in ("off", "on")
    }
    assert got["on"] == got["off"]


def test_stops_equal_plain_and_the_next_step_is_submitted_first(llms) -> None:  # type: ignore[no-untyped-def]
    plain = _outputs(llms["off"], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    stop_token, stop_text = plain[1][0][2], plain[2][1][2:4]
    params = [
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, stop_token_ids=(stop_token,)),
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, stop=[stop_text] if stop_text else None),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    ]
    eng = llms["on"].engine
    ahead: list[bool] = []
    make_events = eng.finish_step

    def watch(*args: Any) -> Any:
        ahead.append(eng.overlap.busy)  # type: ignore[union-attr]
        return make_events(*args)

    eng.finish_step = watch  # type: ignore[method-assign]
    try:
        got = _outputs(llms["on"], params)
    finally:
        del eng.finish_step
    assert got == _outputs(llms["off"], params)
    assert got[1][2] == "stop" and got[3][2] == "length"
    assert sum(ahead) >= len(ahead) - 3  # all but the last steps overlapped the next one
    _assert_nothing_held(eng)


def test_abort_mid_run_frees_everything(llms) -> None:  # type: ignore[no-untyped-def]
    eng = llms["on"].engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for rid, prompt in enumerate(PROMPTS[:3]):
        eng.add_request(100 + rid, prompt, params)
    seen: dict[int, int] = {}
    for step in range(40):
        for ev in eng.step():
            seen[ev.rid] = seen.get(ev.rid, 0) + 1
        if step == 3:
            eng.abort(101)
        if not eng.has_unfinished:
            break
    assert seen[100] == 12 and seen[102] == 12 and seen.get(101, 0) < 12
    for rid in (100, 101, 102):
        eng.release(rid)
    _assert_nothing_held(eng)
