"""The confidence planner never chooses a plan that loses to no drafting (issue 16 item 3): a plan that
verifies drafts pays the draft pass that prepares them (per batch, per draft depth) on top of its verify
step; a plan that verifies nothing pays neither. Checked on synthetic cost tables, the H200's measured
figures among them (draft pass 11.7 ms vs a 7.6 ms verify step at batch 1, 114.6 vs 29.7 ms at batch 64),
against brute force over every allocation and depth, in the native scheduler and in the benchmark's
policy table."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgraph.runtime.engine_config import check_draft_cost
from dsgraph.runtime.spec_pause import DraftCost
from dsgraph.runtime.spec_schedule import make_curve, plan_rate, plan_verification
from tests.runtime.test_spec_scheduler import drafts_for, make

P = [0.9, 0.8, 0.7, 0.6, 0.5]  # the bench's stated acceptance model (conditional, per position)
EXPECTED_5 = 1 + sum(np.cumprod(P))  # tokens per request verifying all 5 drafts: 3.5824


def h200_curve(batch: int, verify0_ms: float, per_row_ms: float):  # type: ignore[no-untyped-def]
    """Verify-step time for batch * (1 + k) rows, k = 0..5: the measured verify-0 step plus per_row_ms
    for each draft row (per_row_ms = 0: verifying is free, the case most favourable to drafting)."""
    sizes = [batch * (1 + k) for k in range(6)]
    return make_curve(sizes, [verify0_ms + per_row_ms * batch * k for k in range(6)])


@pytest.mark.parametrize("per_row_ms", [0.0, 0.05])
def test_h200_batch_64_chooses_no_drafting(per_row_ms: float) -> None:
    curve = h200_curve(64, 29.7, per_row_ms)
    plan = plan_verification([P] * 64, curve, 5 * 64, draft_ms=114.6)
    # best drafting plan (all 5, verify free): 64 * 3.58 / (29.7 + 114.6) = 1.59 tokens/ms < 64 / 29.7
    assert plan.total_drafts == 0 and plan.draft_ms == 0.0
    assert plan_rate(plan) == pytest.approx(64 / 29.7)


def test_h200_batch_1_chooses_drafting() -> None:
    curve = h200_curve(1, 7.6, 0.2)
    # 3.58 / (7.6 + 5 * 0.2 + 11.7) = 0.176 tokens/ms > 1 / 7.6 = 0.132: drafting pays even at 11.7 ms
    plan = plan_verification([P], curve, 5, draft_ms=11.7)
    assert plan.total_drafts == 5 and plan.draft_ms == 11.7
    assert plan_rate(plan) == pytest.approx(EXPECTED_5 / (7.6 + 1.0 + 11.7))
    cheap = plan_verification([P], curve, 5, draft_ms=1.9)  # a pass at 25% of the step
    assert cheap.total_drafts == 5 and plan_rate(cheap) > plan_rate(plan) > 1 / 7.6


def test_the_old_sunk_cost_rule_chose_drafts_at_batch_64() -> None:
    """Charging the pass to every candidate (`fixed_ms`, the rule the engine used) picks drafts at b64:
    the case the draft cost must now refuse."""
    curve = h200_curve(64, 29.7, 0.05)
    assert plan_verification([P] * 64, curve, 5 * 64, fixed_ms=114.6).total_drafts > 0
    assert plan_verification([P] * 64, curve, 5 * 64, draft_ms=114.6).total_drafts == 0


def test_a_per_depth_cost_caps_the_depth() -> None:
    curve = make_curve([1, 2, 3, 4, 5, 6], [10.0] * 6)  # verify rows are free
    # depth 4 costs 1 ms, depth 5 costs 40: (1 + .9 + .72 + .504 + .3024) / 11 = 0.312 beats
    # 3.5824 / 50 = 0.072, and beats no drafting (0.1)
    plan = plan_verification([P], curve, 5, draft_ms=[1.0, 1.0, 1.0, 1.0, 40.0])
    assert list(plan.drafts) == [4] and plan.draft_ms == 1.0
    # a depth table shorter than nextn: its last entry covers the deeper passes
    assert list(plan_verification([P], curve, 5, draft_ms=[1.0]).drafts) == [5]
    with pytest.raises(ValueError, match=r"draft_ms\[1\] = -1.0+; expected a finite cost in ms >= 0"):
        plan_verification([P], curve, 5, draft_ms=[1.0, -1.0])


def brute_force(rows, time, max_total, depth_ms):  # type: ignore[no-untyped-def]
    """Best rate over every allocation: T = 0 costs time(N); otherwise time(N + T) + the pass of the
    deepest request's depth (the last entry covering deeper ones)."""
    best = len(rows) / time(len(rows))
    for ks in itertools.product(*(range(len(r) + 1) for r in rows)):
        total = sum(ks)
        if total == 0 or total > max_total:
            continue
        expected = len(rows) + sum(sum(np.cumprod(r)[:k]) for r, k in zip(rows, ks, strict=True))
        depth = max(ks)
        best = max(best, expected / (time(len(rows) + total) + depth_ms[min(depth, len(depth_ms)) - 1]))
    return best


def linear(n: int) -> float:
    return 2.0 + 0.3 * n


CURVE = make_curve(range(1, 25), [linear(n) for n in range(1, 25)])


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(st.lists(st.floats(0.0, 1.0), min_size=0, max_size=4), min_size=1, max_size=3),
    max_total=st.integers(0, 12),
    depth_ms=st.lists(st.sampled_from([0.0, 0.5, 2.0, 6.0, 30.0]), min_size=1, max_size=4),
)
def test_plan_reaches_the_brute_force_optimum_with_a_draft_pass(rows, max_total, depth_ms) -> None:  # type: ignore[no-untyped-def]
    plan = plan_verification(rows, CURVE, max_total, draft_ms=sorted(depth_ms))
    assert plan_rate(plan) == pytest.approx(brute_force(rows, linear, max_total, sorted(depth_ms)), rel=1e-12)
    assert plan_rate(plan) >= len(rows) / linear(len(rows)) * (1 - 1e-12)  # never below no drafting
    assert (plan.draft_ms == 0.0) == (plan.total_drafts == 0 or sorted(depth_ms)[0] == 0.0)


def test_scheduler_plans_no_drafts_when_the_draft_pass_loses() -> None:
    curve = make_curve([1, 2, 4, 8, 16, 32], [10.0, 10.5, 11.0, 14.0, 25.0, 50.0])
    got = []
    for depth_ms in ([0.0], [100.0], [1.0, 1.0, 1.0, 1.0, 100.0]):
        s = make(curve, verify_mode="confidence")
        s.native.draft_depth_ms = depth_ms
        s.add_request(1, list(range(10, 15)), max_tokens=30)
        plan = s.schedule()
        plan = s.advance([7], None, drafts_for(plan, {1: [41] * 5}, {1: [0.5] * 5}))[1]
        want = plan_verification([[0.5] * 5], curve, 32 - 1, draft_ms=depth_ms)
        assert plan.num_verify_drafts == want.total_drafts
        got.append(plan.num_verify_drafts)
    # [0.5] * 5: a free pass: 3 drafts (1.875 / 11); a 100 ms pass: none (1 / 10 beats 1.97 / 114);
    # depths 1..4 at 1 ms: 3 drafts again (1.875 / 12 = 0.156 > 0.1)
    assert got == [3, 0, 3]
    with pytest.raises(ValueError, match=r"Scheduler.draft_depth_ms\[0\] = -1.0+; expected a finite"):
        s.native.draft_depth_ms = [-1.0]


def test_draft_cost_by_depth() -> None:
    cost = DraftCost({1: (1.0, 2.0, 4.0), 8: 10.0}, alpha=0.5)
    assert cost.by_depth(1) == [1.0, 2.0, 4.0] and cost.predict(1) == 4.0
    assert cost.by_depth(5) == [10.0] and DraftCost().by_depth(3) == []
    cost.observe(1, 8.0)  # the full-depth pass moves halfway; the shallower depths keep their shares
    assert cost.by_depth(1) == pytest.approx([1.5, 3.0, 6.0])
    check_draft_cost(((1, 8), ((1.0, 2.0), 3.0)))
    with pytest.raises(ValueError, match=r"draft_cost = .*\(got \(1.0, -2.0\) for 1 sequences\)"):
        check_draft_cost(((1,), ((1.0, -2.0),)))


def test_bench_policies_never_lose_to_no_drafting() -> None:
    from dsgraph.tools.bench.spec_bench import ACCEPTANCE, _policies

    for batch, verify0, draft, per_row in ((1, 7.6, 11.7, 0.2), (64, 29.7, 114.6, 0.05)):
        t_verify = {k: verify0 + per_row * batch * k for k in range(6)}
        for p in ACCEPTANCE.values():
            row = _policies(batch, t_verify, draft, p)
            assert row["confidence_tokens_per_s"] >= row["off_tokens_per_s"] * (1 - 1e-12)
    b64 = _policies(64, {k: 29.7 + 3.2 * k for k in range(6)}, 114.6, ACCEPTANCE["synthetic_0.9_to_0.5"])
    assert b64["confidence_drafts_per_request"] == 0
    b1 = _policies(1, {k: 7.6 + 0.2 * k for k in range(6)}, 11.7, ACCEPTANCE["synthetic_0.9_to_0.5"])
    assert b1["confidence_drafts_per_request"] == 5 and b1["confidence_tokens_per_s"] > b1["off_tokens_per_s"]
