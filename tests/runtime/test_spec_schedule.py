"""Confidence-scheduled verification (runtime/csrc/spec_schedule.h): the planner against brute force.

Brute force enumerates every allocation (k_0..k_{N-1}), 0 <= k_i <= drafts held, and scores it with the
synthetic step-time formula evaluated here (never through the curve under test): expected emitted
tokens N + sum_i sum_{j<k_i} prod_{l<=j} q_il, over time(N + other_rows + sum k_i). Three curve shapes:
linear and concave (a point at every size, so lookup needs no interpolation) and step-shaped buckets
(powers of two, a step costs its bucket's time).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgraph.runtime.spec_schedule import (
    SpecScheduleConfig,
    ThroughputCurve,
    VerifyScheduler,
    as_confidences,
    make_curve,
    plan_fixed,
    plan_verification,
    split_drafts,
)

NEXTN = 5
LARGEST = 32
Rows = list[list[float] | None]


def linear_time(n: int) -> float:
    return 2.0 + 0.15 * n


def concave_time(n: int) -> float:
    return 1.0 + 0.9 * math.sqrt(n)


BUCKETS = (1, 2, 4, 8, 16, 32)
BUCKET_MS = {1: 1.0, 2: 1.02, 4: 1.05, 8: 1.3, 16: 2.2, 32: 4.5}


def bucket_time(n: int) -> float:
    return BUCKET_MS[min(b for b in BUCKETS if b >= n)]


CURVES: dict[str, tuple[Callable[[int], float], ThroughputCurve]] = {
    "linear": (
        linear_time,
        make_curve(range(1, LARGEST + 1), [linear_time(n) for n in range(1, LARGEST + 1)]),
    ),
    "concave": (
        concave_time,
        make_curve(range(1, LARGEST + 1), [concave_time(n) for n in range(1, LARGEST + 1)]),
    ),
    "buckets": (bucket_time, make_curve(BUCKETS, [BUCKET_MS[b] for b in BUCKETS])),
}


def cumulative(row: list[float] | None) -> list[float]:
    return list(itertools.accumulate(row or [], lambda a, b: a * b))


def allocations(rows: Rows) -> itertools.product:
    return itertools.product(*(range(len(r or []) + 1) for r in rows))


def expected_of(rows: Rows, ks: tuple[int, ...] | np.ndarray) -> float:
    return len(rows) + sum(sum(cumulative(r)[: int(k)]) for r, k in zip(rows, ks, strict=True))


def brute_force_best(
    rows: Rows, time: Callable[[int], float], max_total: int, other: int, fixed_ms: float = 0.0
) -> float:
    best = 0.0
    for ks in allocations(rows):
        total = sum(ks)
        if total <= max_total and len(rows) + other + total <= LARGEST:
            best = max(best, expected_of(rows, ks) / (time(len(rows) + other + total) + fixed_ms))
    return best


probability = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 1.0))
request_rows = st.one_of(st.none(), st.lists(probability, min_size=0, max_size=NEXTN))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(request_rows, min_size=1, max_size=4),
    curve_name=st.sampled_from(sorted(CURVES)),
    max_total=st.integers(0, 20),
    other=st.integers(0, 6),
)
def test_plan_reaches_the_brute_force_optimum(
    rows: Rows, curve_name: str, max_total: int, other: int
) -> None:
    time, curve = CURVES[curve_name]
    plan = plan_verification(rows, curve, max_total, other_rows=other)
    drafts = plan.drafts
    held = [len(r or []) for r in rows]
    assert all(0 <= k <= h for k, h in zip(drafts, held, strict=True))
    assert plan.total_drafts == drafts.sum() <= max_total
    assert plan.num_rows == len(rows) + other + plan.total_drafts <= LARGEST
    assert plan.expected_tokens == pytest.approx(expected_of(rows, drafts), rel=1e-12)
    assert plan.step_ms == pytest.approx(time(plan.num_rows), rel=1e-12)
    best = brute_force_best(rows, time, max_total, other)
    assert plan.expected_tokens / plan.step_ms == pytest.approx(best, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(request_rows, min_size=1, max_size=4),
    curve_name=st.sampled_from(sorted(CURVES)),
    max_total=st.integers(0, 20),
    fixed_ms=st.sampled_from([0.0, 0.5, 3.0, 50.0]),
)
def test_plan_with_a_fixed_cost_reaches_the_brute_force_optimum(
    rows: Rows, curve_name: str, max_total: int, fixed_ms: float
) -> None:
    time, curve = CURVES[curve_name]
    plan = plan_verification(rows, curve, max_total, fixed_ms=fixed_ms)
    assert plan.step_ms == pytest.approx(time(plan.num_rows), rel=1e-12)  # the curve's part only
    got = plan.expected_tokens / (plan.step_ms + fixed_ms)
    assert got == pytest.approx(brute_force_best(rows, time, max_total, 0, fixed_ms), rel=1e-12)


def test_a_fixed_cost_buys_more_drafts() -> None:
    # Hand-checked on the bucket curve, one request holding [0.5] * 5 (cumulative .5 .25 .125 ...), T
    # drafts cost 1 + T rows: no fixed cost: 1.5/1.02 = 1.47, 1.875/1.05 = 1.79 (T = 3, bucket 4) beats
    # 1.96875/1.3 = 1.51 (T = 5, bucket 8) -> 3 drafts; 10 ms per step: 1.875/11.05 = 0.170 <
    # 1.96875/11.3 = 0.174 -> all 5.
    curve = CURVES["buckets"][1]
    assert list(plan_verification([[0.5] * 5], curve, 5).drafts) == [3]
    assert list(plan_verification([[0.5] * 5], curve, 5, fixed_ms=10.0).drafts) == [5]
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="fixed_ms = .*expected a finite cost in ms >= 0"):
            plan_verification([[0.5]], curve, 1, fixed_ms=bad)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(request_rows, min_size=1, max_size=4))
def test_greedy_prefix_is_optimal_for_every_total(rows: Rows) -> None:
    held = sum(len(r or []) for r in rows)
    best_by_total = [0.0] * (held + 1)
    for ks in allocations(rows):
        best_by_total[sum(ks)] = max(best_by_total[sum(ks)], expected_of(rows, ks))
    for total in range(held + 1):
        drafts = split_drafts(rows, total)
        assert drafts.sum() == total
        assert all(0 <= k <= len(r or []) for k, r in zip(drafts, rows, strict=True))
        assert expected_of(rows, drafts) == pytest.approx(best_by_total[total], rel=1e-12)


def test_plan_takes_the_most_probable_drafts_within_a_bucket() -> None:
    # Hand-checked against the bucket curve: 2 requests start at 2 rows (1.02 ms, 2/1.02 = 1.96);
    # 2 drafts fill bucket 4: (2 + 0.9 + 0.72) / 1.05 = 3.45; a 3rd needs bucket 8: 4.1 / 1.3 = 3.15;
    # all 5: 4.73 / 1.3 = 3.64 (best).
    rows: Rows = [[0.9, 0.8, 0.5], [0.5, 0.5]]
    plan = plan_verification(rows, CURVES["buckets"][1], max_total=10)
    assert list(plan.drafts) == [3, 2]
    assert plan.expected_tokens == pytest.approx(2 + 0.9 + 0.72 + 0.36 + 0.5 + 0.25)
    assert plan.num_rows == 7 and plan.step_ms == 1.3
    # With max_total 2, bucket 4 holds the best: request 0's first two drafts (0.9, 0.72 > 0.5).
    assert list(plan_verification(rows, CURVES["buckets"][1], max_total=2).drafts) == [2, 0]


def test_ties_go_to_the_lower_request_and_keep_prefixes() -> None:
    assert list(split_drafts([[0.5], [0.5], [0.5]], 2)) == [1, 1, 0]
    # q = 1 keeps the cumulative probability equal along a request: the prefix order still holds.
    assert list(split_drafts([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], 4)) == [3, 1]
    assert list(split_drafts([[0.5, 1.0], [0.5, 0.4]], 3)) == [2, 1]


def test_requests_without_confidences_verify_nothing() -> None:
    curve = make_curve([1, 2, 4, 8], [1.0, 1.0, 1.0, 1.0])  # free drafts: everything useful is taken
    plan = plan_verification([None, [0.9, 0.9], []], curve, max_total=8)
    assert list(plan.drafts) == [0, 2, 0]
    assert plan.expected_tokens == pytest.approx(3 + 0.9 + 0.81)


def test_zero_probability_drafts_are_never_verified() -> None:
    curve = make_curve([1, 2, 4, 8], [1.0, 1.0, 1.0, 1.0])
    plan = plan_verification([[0.7, 0.0, 1.0]], curve, max_total=8)
    assert list(plan.drafts) == [1]


def test_empty_batch_plans_nothing() -> None:
    plan = plan_verification([], CURVES["buckets"][1], max_total=4, other_rows=3)
    assert plan.total_drafts == 0 and plan.num_rows == 3 and plan.expected_tokens == 0
    assert plan.step_ms == 1.05


def test_fixed_mode_verifies_min_of_length_and_held() -> None:
    rows: Rows = [[0.9, 0.8, 0.7], None, [0.5]]
    plan = plan_fixed(rows, 2, max_total=100)
    assert list(plan.drafts) == [2, 0, 1]
    assert plan.expected_tokens == pytest.approx(3 + 0.9 + 0.72 + 0.5)
    assert plan.step_ms == 0  # no curve
    timed = plan_fixed(rows, 2, max_total=100, curve=CURVES["buckets"][1])
    assert timed.num_rows == 6 and timed.step_ms == 1.3


def test_fixed_mode_trims_last_positions_first() -> None:
    rows: Rows = [[0.1] * 3, [0.1] * 3, [0.1] * 3]
    assert list(plan_fixed(rows, 3, max_total=5).drafts) == [2, 2, 1]
    # The curve bounds the rows too: 3 requests + 2 other rows leave 3 of bucket 8.
    assert list(plan_fixed(rows, 3, max_total=100, curve=make_curve([8], [1.0]), other_rows=2).drafts) == [
        1,
        1,
        1,
    ]


def test_cumulative_products_are_computed_inside() -> None:
    from dsgraph.runtime import _native

    values, lengths = as_confidences([[0.5, 0.5, 0.2], None, [0.9]])
    cum = _native.cumulative_acceptance(values, lengths)
    np.testing.assert_allclose(cum, [[0.5, 0.25, 0.05], [0, 0, 0], [0.9, 0, 0]])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[0.5, 1.5]], r"confidences\[0, 1\] = 1.5\d* is not a probability"),
        ([[0.5], [float("nan")]], r"confidences\[1, 0\] = nan is not a probability"),
        ([[-0.1]], r"confidences\[0, 0\] = -0.1\d* is not a probability"),
    ],
)
def test_bad_confidences_name_the_entry(rows: Rows, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_verification(rows, CURVES["buckets"][1], max_total=4)


def test_plan_errors_name_the_argument() -> None:
    curve = CURVES["buckets"][1]
    with pytest.raises(ValueError, match=r"30 requests \+ 3 other rows exceed the curve's largest size 32"):
        plan_verification([[0.5]] * 30, curve, max_total=4, other_rows=3)
    with pytest.raises(ValueError, match=r"max_total = -1 is negative"):
        plan_verification([[0.5]], curve, max_total=-1)
    with pytest.raises(ValueError, match=r"total = 3 is outside 0..drafts held 2"):
        split_drafts([[0.5], [0.5]], 3)
    with pytest.raises(ValueError, match=r"draft_len = -1 is negative"):
        plan_fixed([[0.5]], -1, max_total=4)
    with pytest.raises(ValueError, match=r"a request holds 3 drafts; expected at most nextn = 2"):
        as_confidences([[0.1, 0.2, 0.3]], nextn=2)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(
        ValueError, match=r"SpecScheduleConfig.mode = 'auto'; expected 'confidence' or 'fixed'"
    ):
        SpecScheduleConfig(mode="auto")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SpecScheduleConfig.nextn = 0 is not positive"):
        SpecScheduleConfig(nextn=0)
    with pytest.raises(ValueError, match=r"SpecScheduleConfig.draft_len = 6 is outside 0..nextn = 5"):
        SpecScheduleConfig(draft_len=6)
    with pytest.raises(ValueError, match=r"mode 'confidence' needs a throughput curve"):
        VerifyScheduler(SpecScheduleConfig(), None)


def test_scheduler_fixed_mode_needs_no_curve() -> None:
    scheduler = VerifyScheduler(SpecScheduleConfig(mode="fixed", draft_len=2), None)
    plan = scheduler.plan([[0.9, 0.9, 0.9], None], max_total=8)
    assert list(plan.drafts) == [2, 0] and plan.step_ms == 0
    scheduler.observe(3, 1.0)  # nothing to correct
    assert scheduler.snapshot()["curve_slope_ms"] is None


def test_scheduler_plans_with_the_corrected_curve() -> None:
    profile = make_curve([1, 2, 4, 8], [1.0, 1.0, 1.0, 1.0])  # drafts look free
    scheduler = VerifyScheduler(SpecScheduleConfig(min_samples=3), profile)
    rows: Rows = [[0.5, 0.5, 0.5]]
    assert list(scheduler.plan(rows, max_total=8).drafts) == [3]
    for n in (1, 2, 4, 8) * 3:  # the device costs 1 ms more per padded row than profiled
        scheduler.observe(n, 1.0 + min(b for b in (1, 2, 4, 8) if b >= n))
    assert scheduler.curve is not None and scheduler.curve.slope_ms == pytest.approx(1.0)
    assert profile.num_samples == 0  # the profile given is copied, not corrected in place
    # Now predict(n) = 1 + bucket: 1/2 with no draft, 1.5/3 with one (not better), 1.875/5 with all.
    plan = scheduler.plan(rows, max_total=8)
    assert list(plan.drafts) == [0] and plan.step_ms == pytest.approx(2.0)
    scheduler.record([1], [1], [[0.5]])
    snap = scheduler.snapshot()
    assert snap["mode"] == "confidence" and snap["curve_slope_ms"] == pytest.approx(1.0)
    assert snap["accepted_tokens"] == 1
