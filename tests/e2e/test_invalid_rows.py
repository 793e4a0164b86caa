"""A request whose logits hold NaN or +inf, or whose sampled id is outside the vocabulary, fails alone on
every engine path: overlapped (zero-overhead) steps and DSpark verify steps as well as plain ones (the
server test covers those, test_server_resilience.py). The others' tokens equal a run without the bad
request, the engine holds no slot or page afterwards and serves the next requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.row_checks import NON_FINITE
from dsgraph.runtime.sampler import Samples
from dsgraph.runtime.sampling_params import SamplingParams
from tests.e2e.test_overlap import _assert_nothing_held
from tests.engine_faults import poison_logits, poison_samples
from tests.oracle import model_fixtures as fx
from tests.runtime.test_spec_engine import CURVE

POISON = 7  # the first token of the bad request's prompt
BAD = 0  # its request id
PROMPTS = [[POISON, *fx.prompt(40, 6)], fx.prompt(41, 5), fx.prompt(42, 9), fx.prompt(43, 3)]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


def _engine(model_dir, path: str) -> Engine:  # type: ignore[no-untyped-def]
    base: dict[str, Any] = dict(max_model_len=64, enable_prefix_cache=False)
    if path == "overlap":
        return Engine(model_dir, EngineConfig.from_flat(overlap="on", speculative="off", **base))
    return Engine(model_dir, EngineConfig.from_flat(speculative="dspark", throughput_curve=CURVE, **base))


def _drive(engine: Engine, prompts: dict[int, list[int]]) -> dict[int, tuple[list[int], str, str | None]]:
    """rid -> (tokens, finish reason, error) once every request ended."""
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, GREEDY)
    tokens: dict[int, list[int]] = {rid: [] for rid in prompts}
    done: dict[int, tuple[list[int], str, str | None]] = {}
    for _ in range(500):
        for ev in engine.step():
            if ev.token >= 0 and ev.finish_reason != "error":
                tokens[ev.rid].append(ev.token)
            if ev.finished:
                done[ev.rid] = (tokens[ev.rid], ev.finish_reason or "", ev.error)
        if not engine.has_unfinished:
            break
    for rid in prompts:
        engine.release(rid)
    return done


def _bad_rows(engine: Engine, plan) -> list[int]:  # type: ignore[no-untyped-def]
    return [i for i, rid in enumerate(plan.sample_rids.tolist()) if rid == BAD and rid in engine.live]


def _poison_logits(engine: Engine, value: float) -> Callable[[], None]:
    return poison_logits(engine, lambda plan: _bad_rows(engine, plan), 3, value)


def _poison_tokens(engine: Engine, vocab: int) -> Callable[[], None]:
    """The bad request's sampled ids become `vocab + 5` (plain/overlap sampling, or the verified
    emission of a DSpark step)."""
    if engine.spec is None:
        return poison_samples(engine, lambda plan: _bad_rows(engine, plan), vocab + 5)
    spec, verify = engine.spec, engine.spec.verify

    def bad_verify(plan, logits, seqs):  # type: ignore[no-untyped-def]
        v = verify(plan, logits, seqs)
        for i in _bad_rows(engine, plan):
            if v.samples.tokens[i] >= 0:
                v.samples.tokens[i] = vocab + 5
        return v

    spec.verify = bad_verify  # type: ignore[method-assign]
    return lambda: spec.__dict__.pop("verify", None)


@pytest.fixture(scope="module", params=["overlap", "dspark"])
def engine_and_alone(request, model_dir):  # type: ignore[no-untyped-def]
    engine = _engine(model_dir, request.param)
    alone = _drive(engine, {rid: PROMPTS[rid] for rid in range(1, len(PROMPTS))})
    return engine, alone


@pytest.mark.parametrize("fault", ["nan", "+inf", "token"])
def test_a_bad_row_fails_only_its_request(engine_and_alone, fault: str) -> None:  # type: ignore[no-untyped-def]
    engine, alone = engine_and_alone
    vocab = engine.cfg.text.vocab_size
    if fault == "token":
        undo = _poison_tokens(engine, vocab)
        cause = f"sampled token id{'' if engine.spec is None else f' {vocab + 5}'} is outside the vocabulary"
    else:
        undo = _poison_logits(engine, float("nan") if fault == "nan" else float("inf"))
        cause = NON_FINITE
    try:
        got = _drive(engine, dict(enumerate(PROMPTS)))
    finally:
        undo()
    tokens, reason, error = got.pop(BAD)
    assert reason == "error" and error is not None and cause in error, error
    assert all(0 <= t < vocab for t in tokens)
    assert got == alone  # the others: as without the bad request
    _assert_nothing_held(engine)
    assert _drive(engine, {rid: PROMPTS[rid] for rid in range(1, len(PROMPTS))}) == alone


def test_overlap_marks_bad_rows_on_the_device_side() -> None:
    """mark_invalid / marked_causes round trip: token 0 in place of a bad id, the cause in the logprob;
    a good row's logprob passes through, NaN (not computed: the token-only variant) included."""
    from dsgraph.runtime.row_checks import mark_invalid, marked_causes

    logits = torch.zeros(6, 10)
    logits[1, 2] = float("nan")
    logits[2, 5] = float("-inf")  # valid: that token is never sampled
    logits[5, 1] = float("inf")
    s = Samples(
        torch.tensor([3, 4, 12, -1, 6, 2], dtype=torch.int32),
        torch.tensor([-0.5, -0.5, -0.5, float("-inf"), float("nan"), float("nan")]),
        torch.zeros(6, 2),
        torch.zeros(6, 2, dtype=torch.int32),
    )
    m = mark_invalid(logits, s, 10)
    assert m.tokens.tolist() == [3, 0, 0, 0, 6, 0]
    causes = marked_causes(m, 10)
    assert causes[1] == NON_FINITE and causes[5] == NON_FINITE and set(causes) == {1, 2, 3, 5}
    assert "outside the vocabulary [0, 10)" in causes[2] and "outside the vocabulary" in causes[3]
    assert np.isclose(float(m.logprobs[0]), -0.5) and np.isnan(float(m.logprobs[4]))


def test_a_draft_outside_the_vocabulary_is_dropped(model_dir) -> None:  # type: ignore[no-untyped-def]
    """A broken drafter's out-of-vocabulary drafts are never fed to the next step: the request goes on
    with the drafts before it, and its tokens are those of a run with sane drafts."""
    engine = _engine(model_dir, "dspark")
    prompts = {rid: PROMPTS[rid] for rid in range(1, len(PROMPTS))}
    alone = _drive(engine, prompts)
    vocab = engine.cfg.text.vocab_size
    assert engine.spec is not None
    drafter, run = engine.spec.drafter, engine.spec.drafter.run

    def bad_run(requests, **kw):  # type: ignore[no-untyped-def]
        out = run(requests, **kw)
        out.tokens[:, 1:2] = vocab + 3
        return out

    drafter.run = bad_run  # type: ignore[method-assign]
    try:
        assert _drive(engine, prompts) == alone
    finally:
        del drafter.run
    _assert_nothing_held(engine)


def test_a_bad_row_of_the_step_in_flight_fails_when_the_next_step_runs_plain(model_dir) -> None:  # type: ignore[no-untyped-def]
    """The overlapped step in flight is resolved before a step that runs without overlap (here: a
    prompt-logprobs request's prefill); a row marked invalid on the device fails its request there too,
    instead of committing the device's placeholder token."""
    engine = _engine(model_dir, "overlap")
    vocab = engine.cfg.text.vocab_size
    poisoned: list[int] = []  # the plan step whose bad rows are sampled
    undo = poison_samples(
        engine, lambda plan: _bad_rows(engine, plan) if poisoned == [plan.step] else [], vocab + 5
    )
    resolved: list[int] = []
    resolve = engine.resolve_ahead

    def noting(flight, host):  # type: ignore[no-untyped-def]
        resolved.append(int(flight.step))
        return resolve(flight, host)

    engine.resolve_ahead = noting  # type: ignore[method-assign]
    engine.add_request(BAD, PROMPTS[BAD], GREEDY)
    engine.add_request(1, PROMPTS[1], GREEDY)
    events = [ev for _ in range(3) for ev in engine.step()]
    # added now, the request is in the plan the next call makes: the call after it runs plain and
    # resolves the step this next call launches, whose bad row is poisoned
    lp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=1)
    engine.add_request(2, PROMPTS[2], lp)
    plan = engine.take_plan()
    engine.hold_plan(plan)  # looked at, not run: the next call launches it
    poisoned.append(int(plan.step))
    try:
        for _ in range(100):
            events += engine.step()
            if not engine.has_unfinished:
                break
    finally:
        undo()
        del engine.resolve_ahead
    assert poisoned[0] in resolved  # the poisoned step was resolved before a plain step
    bad = [ev for ev in events if ev.rid == BAD]
    assert bad[-1].finish_reason == "error" and "outside the vocabulary" in (bad[-1].error or ""), bad[-1]
    # the tokens before the failure are sampled ones: in the vocabulary, and no failure mark (a positive
    # logprob) in their logprob (NaN: greedy rows that asked for none)
    assert all(ev.token < vocab and not ev.logprob > 0 for ev in bad if ev.token >= 0)
    _assert_nothing_held(engine)
