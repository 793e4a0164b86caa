"""DSpark speculative decoding in the engine (cpu, tiny random checkpoint): greedy output with drafting
(confidence and fixed) equals greedy output without, token for token; a test-only hook that replaces the
drafts with the target's own greedy continuation (corrupted at a varying place) exercises every
acceptance length 0..5 and shows up in the statistics; aborts with drafts pending leak no page or slot;
draft programs are lowered once per bucket; EngineConfig errors name the field; the draft pass pauses
while it does not pay (random weights, a dear draft pass), re-probes and resumes when acceptance rises,
and never pauses while every draft is accepted and the pass is cheap."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dsgraph.runtime.engine import EngineConfig
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from tests.engine_faults import draft_hook
from tests.oracle import model_fixtures as fx

PROMPTS = [fx.prompt(700 + i, n) for i, n in enumerate([3, 17, 5, 11])]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
# Synthetic curve (row counts -> ms): flat up to 32 rows, so the planner verifies confident drafts.
CURVE = ((1, 8, 32, 64, 128, 256), (10.0, 10.2, 10.5, 20.0, 40.0, 80.0))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def reference(model_dir) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=128, speculative="off")
    assert llm.engine.spec is None and llm.engine.spec_stats() is None
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def spec_llm(model_dir, **kw: Any) -> LLM:  # type: ignore[no-untyped-def]
    base: dict[str, Any] = dict(max_model_len=128, speculative="dspark", throughput_curve=CURVE)
    return LLM(model_dir, **{**base, **kw})


def forced_hook(llm: LLM, reference: list[tuple[int, ...]], cut: Any = None):  # type: ignore[no-untyped-def]
    """Drafts = the target's greedy continuation; `cut(rid, index)` (if given) says how many of them stay
    right: the draft at that place is replaced by a wrong token, so exactly that many are accepted."""
    eng = llm.engine
    by_prompt = {tuple(p): list(r) for p, r in zip(PROMPTS, reference, strict=True)}
    calls = {"n": 0}

    def hook(rid: int, position: int, drafts: list[int], conf: list[float]):  # type: ignore[no-untyped-def]
        live = eng.live[rid]
        first = position + 1 - len(live.prompt)  # output index of the first draft
        d = by_prompt[tuple(live.prompt)][first : first + 5]
        if cut is not None:
            right = cut(calls["n"])
            calls["n"] += 1
            if right < len(d):
                d[right] = (d[right] + 1) % eng.cfg.text.vocab_size
        return d, [1.0] * len(d)

    draft_hook(eng).fn = hook
    return llm


@pytest.mark.parametrize("schedule", ["confidence", "fixed"])
def test_greedy_with_drafting_equals_without(model_dir, reference, schedule: str) -> None:  # type: ignore[no-untyped-def]
    llm = spec_llm(model_dir, verify_schedule=schedule)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats = llm.engine.spec_stats()
    assert stats is not None and stats["mode"] == schedule and stats["verified_tokens"] > 0
    if schedule == "confidence":  # measured forward times correct the shared curve online
        assert llm.engine.spec.scheduler.curve.num_samples > 0  # type: ignore[union-attr]
    if schedule == "fixed":  # every decode step verifies all drafts the request can still use
        assert sum(o.outputs[0].num_draft_tokens for o in outs) == stats["verified_tokens"]


def test_every_acceptance_length_gives_the_same_tokens(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    # draft_pause=False here and below: these tests need a draft pass every step, whatever it costs
    llm = forced_hook(
        spec_llm(model_dir, verify_schedule="fixed", draft_pause=False), reference, cut=lambda n: n % 6
    )
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats = llm.engine.spec_stats()
    assert stats is not None
    # drafts 0..k-1 right, draft k wrong: accepted lengths 0..5 all occur
    assert all(n > 0 for n in stats["accepted_at"][:5]) and stats["reached_at"][0] > stats["accepted_at"][0]
    total = sum(o.outputs[0].num_accepted_tokens for o in outs)
    assert total == stats["accepted_tokens"] > 0


def test_forced_continuation_accepts_everything(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    llm = forced_hook(spec_llm(model_dir, draft_pause=False), reference)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats = llm.engine.spec_stats()
    assert stats is not None and stats["accept_rate"] == 1.0 and stats["calibration_mae"] == 0.0
    assert stats["position_accept_rate"] == [1.0] * 5
    for o in outs:
        c = o.outputs[0]
        assert c.num_accepted_tokens == c.num_draft_tokens > 0
    # 16 tokens: the prefill emits 1, then steps of 6 (5 accepted + 1) and the last one short
    assert stats["steps"] <= 4


def test_abort_with_drafts_pending_frees_pages_and_slots(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = spec_llm(model_dir, verify_schedule="fixed", enable_prefix_cache=False, draft_pause=False)
    eng = llm.engine
    for rid, p in enumerate(PROMPTS):
        eng.add_request(rid, p, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    for _ in range(3):
        eng.step()
    planned = eng.take_plan()
    eng.hold_plan(planned)  # looked at, not run
    assert planned is not None and planned.num_verify_drafts > 0  # the next step verifies drafts
    for rid in range(len(PROMPTS)):
        eng.abort(rid)
    while eng.has_unfinished:
        eng.step()
    sched = eng.scheduler
    assert sched.native.num_free_slots == eng.config.scheduler.max_num_seqs
    for r in sched.config.ratios:
        assert sched.page_usage(r).used == 0


def test_draft_programs_are_lowered_once_per_bucket(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = spec_llm(model_dir, verify_schedule="fixed")
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    drafter = llm.engine.spec.drafter  # type: ignore[union-attr]
    built, buckets = llm.engine.session.programs_built, set(drafter.programs)
    assert buckets <= {(1, "greedy"), (2, "greedy")} and buckets  # greedy requests: the greedy variant
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert llm.engine.session.programs_built == built and set(drafter.programs) == buckets


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(speculative="yes"),
            r"^EngineConfig.speculative.mode = 'yes' \(option speculative\): "
            r"expected one of 'auto', 'dspark', 'mtp', 'off'$",
        ),
        (
            dict(verify_schedule="eager"),
            r"^EngineConfig.speculative.verify_schedule = 'eager': expected one of",
        ),
        (dict(draft_len=6), r"^EngineConfig.speculative.draft_len = 6: expected None or an integer in 0..5$"),
        (dict(deterministic=1), r"^EngineConfig.speculative.deterministic = 1: expected a bool$"),
        (
            dict(throughput_curve=((1, 2), (1.0,))),
            r"throughput_curve = .*: expected .* equal, non-zero length",
        ),
        (
            dict(throughput_curve=((2, 1), (1.0, 2.0))),
            r"throughput_curve = .*: expected .*strictly increasing sizes",
        ),
        (dict(draft_pause=1), r"^EngineConfig.speculative.draft_pause = 1: expected a bool$"),
        (dict(draft_cost=((1, 2), (1.0,))), r"draft_cost = .*: expected .* equal, non-zero length"),
        (
            dict(draft_cost=((1,), (math.nan,))),
            r"draft_cost = .*: expected finite draft ms .*\(got nan for 1 sequences\)",
        ),
        (
            dict(draft_cost=((1,), (1.0,)), draft_cost_greedy=((1,), (-1.0,))),
            r"^EngineConfig.speculative.draft_cost_greedy = .*\(got -1.0 for 1 sequences\)",
        ),
        (dict(draft_cost_greedy=((1,), (1.0,))), r"draft_cost_greedy is given without draft_cost"),
    ],
)
def test_engine_config_errors_name_the_field(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_flat(**kw)


def test_auto_is_off_on_cpu(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=64)
    assert llm.engine.spec is None and not llm.engine.model.dspark


def test_sampled_exact_verification_is_reproducible(model_dir) -> None:  # type: ignore[no-untyped-def]
    params = [SamplingParams(temperature=0.8, seed=7 + i, max_tokens=10, ignore_eos=True) for i in range(4)]
    # Exact sampling's tokens depend on which drafts are verified, and the planner weighs the draft
    # pass's cost: measured, it follows timing. A reproducible sampled run fixes that cost and drafts
    # every step (or uses deterministic=True, whose tokens never depend on the drafts).
    llm = spec_llm(model_dir, draft_pause=False, draft_cost=((1, 2, 4, 8), (0.5, 0.5, 0.5, 0.5)))
    first = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    again = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[::-1], params[::-1])][::-1]
    assert first == again and all(len(t) == 10 for t in first)
    assert llm.engine.spec_stats()["verified_tokens"] > 0  # type: ignore[index]


def test_curve_profiled_at_start_and_cached(model_dir, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kw: dict[str, Any] = dict(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8, speculative="dspark"
    )
    llm = LLM(model_dir, **kw)
    assert len(list((tmp_path / "dsgraph" / "curves").glob("throughput-*.json"))) == 1
    curve = llm.engine.spec.scheduler.curve  # type: ignore[union-attr]
    assert list(curve.sizes) == [1, 2, 4, 8] and all(t > 0 for t in curve.step_ms)
    assert all(not t.any() for t in llm.engine.session.caches.values())  # profiling left no state
    # the draft pass is profiled per bucket of sequences, the full graph's and the greedy variant's, and
    # cached beside the curve
    assert len(list((tmp_path / "dsgraph" / "curves" / "draft").glob("throughput-*.json"))) == 2
    costs = llm.engine.spec.cost  # type: ignore[union-attr]
    assert costs.greedy is not None
    cost, greedy = costs.full.ms, costs.greedy.ms
    assert sorted(cost) == sorted(greedy) == [1, 2, 4] and all(
        t > 0 for t in [*cost.values(), *greedy.values()]
    )

    def no_profile(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("profiled again instead of loading the cached curve")

    monkeypatch.setattr("dsgraph.runtime.spec_schedule.profile_curve", no_profile)
    again = LLM(model_dir, **kw)
    assert list(again.engine.spec.scheduler.curve.step_ms) == list(curve.step_ms)  # type: ignore[union-attr]
    assert again.engine.spec.cost.full.ms == cost and again.engine.spec.cost.greedy.ms == greedy  # type: ignore[union-attr]
    outs = again.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 3 for o in outs)


def test_stops_truncate_multi_token_emissions(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    """With drafts always right, one step emits up to 6 tokens: a stop token, a stop string or max_tokens
    inside that emission must end the output exactly where a run without drafting ends it."""
    off = LLM(model_dir, max_model_len=128, speculative="off")
    text = off.tokenizer.decode(list(reference[0]))
    cases = [
        SamplingParams(temperature=0, max_tokens=16, stop_token_ids=(reference[0][4],)),
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=(text[len(text) // 2 :][:2],)),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    ]
    llm = forced_hook(spec_llm(model_dir, verify_schedule="fixed", draft_pause=False), reference)
    for params in cases:
        want, got = off.generate(PROMPTS[:1], params)[0], llm.generate(PROMPTS[:1], params)[0]
        w, g = want.outputs[0], got.outputs[0]
        assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason)
        assert len(w.token_ids) < 16
    assert llm.engine.spec_stats()["accepted_tokens"] > 0  # type: ignore[index]


@pytest.mark.parametrize(("confidence", "verified"), [(0.0, False), (1.0, True)])
def test_confidences_drive_the_planner(model_dir, reference, confidence: float, verified: bool) -> None:  # type: ignore[no-untyped-def]
    llm = forced_hook(spec_llm(model_dir), reference)
    hook = draft_hook(llm.engine).fn

    def with_confidence(rid: int, position: int, drafts: list[int], conf: list[float]):  # type: ignore[no-untyped-def]
        d, _ = hook(rid, position, drafts, conf)  # type: ignore[misc]
        return d, [confidence] * len(d)

    draft_hook(llm.engine).fn = with_confidence
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats: Any = llm.engine.spec_stats()
    # a zero-probability draft is never worth a row; certain ones fit the flat part of the curve
    assert (stats["verified_tokens"] > 0) == verified
    assert stats["accept_rate"] == (1.0 if verified else None)


DEAR = ((1, 8), (1000.0, 1000.0))  # a draft pass no acceptance can pay for against the 10 ms curve
CHEAP = ((1, 8), (0.5, 0.5))


def test_pauses_when_drafting_does_not_pay(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    llm = spec_llm(model_dir, draft_cost=DEAR)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats: Any = llm.engine.spec_stats()
    # 15 decode steps: pauses of 1, 2, 4, 8 steps, each followed by a single probe pass
    assert stats["draft_passes"] == stats["draft_probes"] >= 2
    assert stats["paused_steps"] >= 3 * stats["draft_passes"]
    off: Any = spec_llm(model_dir, draft_cost=DEAR, draft_pause=False)
    off.generate(PROMPTS, GREEDY)
    assert off.engine.spec_stats()["paused_steps"] == 0
    assert off.engine.spec_stats()["draft_passes"] > 3 * stats["draft_passes"]


def test_keeps_drafting_while_it_pays(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    llm = forced_hook(spec_llm(model_dir, draft_cost=CHEAP), reference)
    eng, hook, seen = llm.engine, draft_hook(llm.engine).fn, []  # type: ignore[union-attr]

    def watch(*args: Any):  # type: ignore[no-untyped-def]
        seen.append(eng.scheduler.native.draft_ms)  # what the planner weighed for the step before
        return hook(*args)  # type: ignore[misc]

    draft_hook(eng).fn = watch
    outs = llm.generate(PROMPTS, GREEDY)
    assert seen[0] == 0.0 and set(seen[len(PROMPTS) :]) == {0.5}
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats: Any = llm.engine.spec_stats()
    assert stats["paused_steps"] == 0 and stats["draft_probes"] == 0
    assert stats["draft_passes"] >= stats["steps"] and stats["accept_rate"] == 1.0


def test_resumes_drafting_when_acceptance_rises(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    """Drafts are wrong for the first outputs and right afterwards: drafting pauses, and a probe after
    the pause notices the drafts are accepted now, so drafting goes on every step with no backoff."""
    llm = forced_hook(spec_llm(model_dir, draft_cost=((1, 8), (5.0, 5.0))), reference)
    eng, right = llm.engine, draft_hook(llm.engine).fn

    def wrong_then_right(rid: int, position: int, drafts: list[int], conf: list[float]):  # type: ignore[no-untyped-def]
        d, c = right(rid, position, drafts, conf)  # type: ignore[misc]
        if position + 1 - len(eng.live[rid].prompt) < 6:
            d = [(t + 1) % eng.cfg.text.vocab_size for t in d]
        return d, c

    draft_hook(eng).fn = wrong_then_right
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats: Any = eng.spec_stats()
    assert stats["paused_steps"] >= 2 and stats["draft_probes"] >= 1
    assert stats["draft_backoff"] == 1 and stats["accepted_tokens"] >= 5 * len(PROMPTS)
