"""Pausing the draft pass (runtime/spec_pause.py), device-free: the draft cost table and its online
correction, the realised per-position acceptance rates, the predicted rates with and without drafting
(hand-checked on a step curve), the exponential backoff of the probes and its reset, and the errors.
The engine-level behaviour (pausing on random weights, drafting on when it pays) is in
test_spec_engine.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsgraph.runtime.engine_config import check_draft_cost
from dsgraph.runtime.spec_pause import DraftCost, DraftCosts, DraftPause, PauseConfig
from dsgraph.runtime.spec_schedule import make_curve

NEXTN = 5
CURVE = make_curve([1, 8, 32], [10.0, 10.2, 10.5])  # step lookup: n rows cost the first size >= n


def pause(ms: float) -> DraftPause:
    return DraftPause(CURVE, DraftCosts(DraftCost({1: ms, 8: ms}, fixed=True)), NEXTN)


def decisions(p: DraftPause, steps: int) -> list[bool]:
    return [p.decide(1) for _ in range(steps)]


def test_draft_cost_lookup_and_online_correction() -> None:
    assert DraftCost().predict(3) is None  # nothing known: the engine drafts and measures
    cost = DraftCost({1: 5.0, 4: 9.0}, alpha=0.2)
    # buckets are powers of two; an unknown bucket takes the next larger known one, else the largest
    assert [cost.predict(n) for n in (1, 2, 3, 4, 8)] == [5.0, 9.0, 9.0, 9.0, 9.0]
    cost.observe(3, 19.0)  # bucket 4: 9 + 0.2 * (19 - 9)
    assert cost.ms[4] == pytest.approx(11.0)
    cost.observe(7, 30.0)  # a first measurement of bucket 8 is taken as it is
    assert cost.predict(5) == 30.0
    cost.observe(1, math.nan)
    assert cost.ms[1] == 5.0
    fixed = DraftCost({1: 5.0}, fixed=True)
    fixed.observe(1, 50.0)
    assert fixed.predict(1) == 5.0


def test_realised_rates_are_per_position_moving_averages() -> None:
    p = pause(1.0)
    # seq 0 verified 3, accepted 1: reached positions 0, 1, passed 0; seq 1 verified 2, accepted both
    p.observe([3, 2], [1, 2])
    assert p.rate[:2].tolist() == [1.0, 0.5] and np.isnan(p.rate[2:]).all()
    p.observe([2], [0])  # position 0 reached and failed: 1 + 0.2 * (0 - 1)
    assert p.rate[:2].tolist() == pytest.approx([0.8, 0.5])
    # unseen positions take the newest drafts' mean confidences (1.0 before any)
    p.seed_confidences(np.array([[0.5, 0.2, 0, 0, 0], [0.7, 0, 0, 0, 0]]), np.array([2, 1]))
    assert p.estimate().tolist() == pytest.approx([0.8, 0.5, 1.0, 1.0, 1.0])
    p.seed_confidences(np.array([[0.5, 0.2, 0.3, 0, 0]]), np.array([3]))
    assert p.estimate().tolist() == pytest.approx([0.8, 0.5, 0.3, 1.0, 1.0])


def test_predicted_rates_include_the_draft_pass() -> None:
    # One sequence, every draft certain (no observation yet): 5 drafts make 6 rows (bucket 8, 10.2 ms)
    # and 6 tokens, plus the 5 ms draft pass; without drafting 1 token per 10 ms.
    with_drafts, without = pause(5.0).rates(1)
    assert with_drafts == pytest.approx(6 / 15.2) and without == pytest.approx(0.1)
    p = pause(5.0)
    p.observe([5], [0])  # position 0 never accepted: nothing beyond the anchor's token is expected
    with_drafts, _ = p.rates(1)
    assert with_drafts == pytest.approx(1 / 15.0)


def test_backoff_doubles_up_to_the_limit() -> None:
    p = pause(1000.0)  # a draft pass far dearer than anything it could save
    want: list[bool] = []
    for length in (1, 2, 4, 8, 16, 32, 64, 64):
        want += [False] * length + [True]  # a pause of `length` steps, then one probe pass
    assert decisions(p, len(want)) == want
    assert p.paused_steps == sum(1 for w in want if not w) and p.probes == 8


def test_a_paying_decision_resets_the_backoff() -> None:
    p = DraftPause(CURVE, DraftCosts(DraftCost({1: 1000.0})), NEXTN, PauseConfig(max_backoff=4))
    assert decisions(p, 5) == [False, True, False, False, True]
    p.costs.full.ms[1] = 1.0  # the draft pass became cheap (online correction)
    p.observe([5], [5])
    assert decisions(p, 3) == [True, True, True] and p.backoff == 1
    p.costs.full.ms[1] = 1000.0
    assert decisions(p, 4) == [False, True, False, False]  # the pauses start over at one step


def test_each_variant_is_priced_and_measured_on_its_own_table() -> None:
    """A greedy pass is priced by the greedy variant's table (the full graph's while it knows nothing)
    and its measurements move only that table; a sampled pass uses the full graph's."""
    costs = DraftCosts(DraftCost({1: 50.0}), DraftCost())
    assert costs.pricing(True) is costs.full  # nothing known of the variant yet
    costs.measuring(True).observe(1, 2.0)
    assert costs.pricing(True).predict(1) == 2.0 and costs.pricing(False).predict(1) == 50.0
    costs.measuring(False).observe(1, 60.0)
    assert costs.greedy is not None and costs.greedy.ms == {1: 2.0} and costs.full.ms[1] == 52.0
    one = DraftCosts(DraftCost({1: 7.0}))  # no variant table: one prices both
    assert one.pricing(True) is one.measuring(True) is one.full
    # the pause decides on the variant that will run: drafting pays at 2 ms, not at 50
    p = DraftPause(
        CURVE, DraftCosts(DraftCost({1: 50.0}, fixed=True), DraftCost({1: 2.0}, fixed=True)), NEXTN
    )
    p.observe([5], [5])
    assert p.decide(1, greedy=True) and not p.decide(1, greedy=False)


def test_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="PauseConfig.max_backoff = 0"):
        PauseConfig(max_backoff=0)
    with pytest.raises(ValueError, match="PauseConfig.alpha = 0.0"):
        PauseConfig(alpha=0.0)
    with pytest.raises(ValueError, match="DraftCost.alpha = 2"):
        DraftCost(alpha=2)
    with pytest.raises(ValueError, match=r"draft_cost = .*: expected .*equal, non-zero length"):
        check_draft_cost(((1, 2), (1.0,)))
    with pytest.raises(ValueError, match=r"draft_cost = .*: expected sequence counts >= 1 \(got 0\)"):
        check_draft_cost(((0,), (1.0,)))
    with pytest.raises(ValueError, match=r"draft_cost = .*\(got -1.0 for 1 sequences\)"):
        check_draft_cost(((1,), (-1.0,)))


def test_a_bundle_keeps_both_variant_tables() -> None:
    """`dsgraph compile` writes the profiled tables of both variants; a start from the bundle gives them
    to the config as draft_cost and draft_cost_greedy (a caller's own draft_cost wins over both)."""
    from types import SimpleNamespace

    from dsgraph.runtime.bundle.compile import _tables
    from dsgraph.runtime.bundle.load import Bundle
    from dsgraph.runtime.engine_config import EngineConfig

    costs = DraftCosts(DraftCost({1: 5.0, 4: 9.0}), DraftCost({1: 2.0}))
    engine = SimpleNamespace(spec=SimpleNamespace(scheduler=SimpleNamespace(curve=None), cost=costs))
    tables = _tables(engine)
    assert tables == {"draft_cost": [[1, 4], [5.0, 9.0]], "draft_cost_greedy": [[1], [2.0]]}
    bundle = object.__new__(Bundle)
    bundle.manifest = {"tables": tables}
    spec = bundle.with_tables(EngineConfig()).speculative
    assert spec.draft_cost == ((1, 4), (5.0, 9.0)) and spec.draft_cost_greedy == ((1,), (2.0,))
    own = bundle.with_tables(EngineConfig.from_flat(draft_cost=((1,), (3.0,)))).speculative
    assert own.draft_cost == ((1,), (3.0,)) and own.draft_cost_greedy is None
    # no greedy table without the full graph's
    engine.spec.cost = DraftCosts(DraftCost(), DraftCost({1: 2.0}))
    assert _tables(engine) == {}
