"""Verify rows in the C++ scheduler, through Python: the row layout of a request holding drafts, commits of
0..k accepted drafts, stop conditions inside a multi-token emission, page trimming after the commit, the
token budget, abort and preemption with drafts pending (no page or slot leaked), the planner's choice in
the plan (compared with the planner called directly) and the errors of a bad commit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgraph.runtime.scheduler import Scheduler, SchedulerConfig, StepPlan
from dsgraph.runtime.spec_schedule import make_curve, plan_verification

NEXTN = 5


def make(curve: Any = None, **kw: Any) -> Scheduler:
    base: dict[str, Any] = dict(
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=64,
        page_size=4,
        ratios=(1, 2),
        num_pages=(40, 40),
        vocab_size=100,
        verify_mode="fixed",
        nextn=NEXTN,
    )
    return Scheduler(SchedulerConfig(**{**base, **kw}), curve)


def drafts_for(plan: StepPlan, per_rid: dict[int, list[int]], conf: dict[int, list[float]] | None = None):
    """The commit's draft arrays: per plan sequence, the drafts of its request (none if absent)."""
    seqs = plan.num_seqs
    tokens = np.zeros((seqs, NEXTN), np.int32)
    lengths = np.zeros(seqs, np.int32)
    c = np.zeros((seqs, NEXTN), np.float64)
    for s, rid in enumerate(plan.seq_rids.tolist()):
        d = per_rid.get(rid, [])
        tokens[s, : len(d)], lengths[s] = d, len(d)
        if conf is not None:
            c[s, : len(d)] = conf.get(rid, [1.0] * len(d))
    return tokens, lengths, (c if conf is not None else None)


def prefill(
    s: Scheduler, prompts: dict[int, int], drafts: dict[int, list[int]], max_tokens: int = 30
) -> StepPlan:
    """Adds the requests, runs their prefill (emitting token 7 each) and stores their drafts."""
    for rid, n in prompts.items():
        s.add_request(rid, list(range(10, 10 + n)), max_tokens=max_tokens)
    plan = s.schedule()
    return s.advance([7] * len(plan.sample_rows), None, drafts_for(plan, drafts))[1]


def test_verify_rows_layout() -> None:
    s = make()
    plan = prefill(s, {1: 5, 2: 3}, {1: [41, 42, 43, 44, 45], 2: [51, 52]})
    assert plan.num_decode == 2 and plan.num_verify_drafts == 7
    assert plan.token_ids[: plan.num_tokens].tolist() == [7, 41, 42, 43, 44, 45, 7, 51, 52]
    assert plan.positions[: plan.num_tokens].tolist() == [5, 6, 7, 8, 9, 10, 3, 4, 5]
    assert plan.seq_start.tolist() == [5, 3] and plan.seq_end.tolist() == [11, 6]
    assert plan.sample_rows.tolist() == list(range(9)) and plan.sample_rids.tolist() == [1] * 6 + [2] * 3
    assert plan.verify_start.tolist() == [0, 6] and plan.verify_len.tolist() == [6, 3]
    # lookback is the committed history, never a draft
    assert plan.lookback[0].tolist() == [14, 13, 12] and plan.lookback[1].tolist() == [12, 11, 10]


@pytest.mark.parametrize("accepted", range(NEXTN + 1))
def test_commit_of_accepted_prefix(accepted: int) -> None:
    s = make()
    d = [41, 42, 43, 44, 45]
    plan = prefill(s, {1: 5}, {1: d})
    rows = [*d[:accepted], 60, *([-1] * (NEXTN - accepted))]
    events, plan = s.advance(rows, [accepted + 1], drafts_for(plan, {1: [70, 71]}))
    assert [(e.rid, e.token, e.finished) for e in events] == [(1, t, False) for t in [*d[:accepted], 60]]
    alloc = s.native.allocation(1)
    assert alloc.tokens == [*range(10, 15), 7, *d[:accepted], 60]
    assert alloc.num_cached == 5 + accepted + 1  # prompt, the old newest token, the accepted drafts
    assert s.drafts_of(1) == [70, 71]
    assert plan.token_ids[:3].tolist() == [60, 70, 71] and plan.seq_start.tolist() == [6 + accepted]


def test_old_single_token_form_emits_first_row() -> None:
    s = make()
    assert prefill(s, {1: 5}, {1: [41, 42, 43]}).verify_len.tolist() == [4]
    events = s.update([30, -1, -1, -1])  # sampled rows beyond the first are ignored
    assert [e.token for e in events] == [30]
    assert s.native.allocation(1).num_cached == 6 and s.drafts_of(1) == []
    assert s.schedule().num_tokens == 1


def test_stop_inside_emission_discards_the_rest() -> None:
    s = make()
    d = [41, 42, 43, 44, 45]
    for rid in (1, 2):
        s.add_request(rid, list(range(10, 15)), max_tokens=30, eos_id=43 if rid == 1 else -1)
    plan = s.schedule()
    plan = s.advance([7, 7], None, drafts_for(plan, {1: d, 2: d}))[1]
    events, _ = s.advance([*d, 60, 41, 60, -1, -1, -1, -1], [6, 2])
    assert [(e.rid, e.token, e.reason) for e in events] == [
        (1, 41, None),
        (1, 42, None),
        (1, 43, "stop"),
        (2, 41, None),
        (2, 60, None),
    ]
    assert s.native.num_requests == 1


def test_max_tokens_caps_drafts_and_emission() -> None:
    s = make()
    s.add_request(1, list(range(10, 15)), max_tokens=3)
    plan = s.schedule()
    plan = s.advance([7], None, drafts_for(plan, {1: [41, 42, 43, 44, 45]}))[1]
    assert plan.verify_len.tolist() == [2]  # 1 output so far: 2 more at most, so 1 draft
    events, plan = s.advance([41, 60], [2])
    assert [(e.token, e.reason) for e in events] == [(41, None), (60, "length")]
    assert plan.bucket == 0 and s.native.num_free_slots == 4


def test_drafts_stop_at_max_model_len() -> None:
    s = make(max_model_len=12, num_pages=(8, 8))
    s.add_request(1, list(range(10, 19)), max_tokens=10)  # 9 prompt tokens
    plan = s.schedule()
    plan = s.advance([7], None, drafts_for(plan, {1: [41, 42, 43, 44, 45]}))[1]
    assert plan.positions[: plan.num_tokens].tolist() == [9, 10, 11]


def page_counts(s: Scheduler, rid: int) -> list[int]:
    return [len(p) for p in s.native.allocation(rid).pages]


def test_pages_grow_for_verify_rows_and_are_trimmed() -> None:
    s = make()
    plan = prefill(s, {1: 6}, {1: [41, 42, 43, 44, 45]})  # 7 tokens, 6 cached
    assert page_counts(s, 1) == [3, 2]  # positions 6..11 -> 12 tokens: 3 pages of r1, 6 entries of r2
    free = (s.native.num_free_pages(1), s.native.num_free_pages(2))
    s.advance([60, -1, -1, -1, -1, -1], [1])  # every draft rejected: 7 tokens cached
    assert page_counts(s, 1) == [2, 1]
    assert (s.native.num_free_pages(1), s.native.num_free_pages(2)) == (free[0] + 1, free[1] + 1)
    assert plan.num_tokens == 6


def test_verify_rows_count_in_budget_after_prefill() -> None:
    s = make(max_num_batched_tokens=12)
    plan = prefill(s, {1: 4, 2: 4}, {1: [41] * 5, 2: [51] * 5})
    assert plan.num_tokens == 12 and plan.num_verify_drafts == 10
    s.add_request(3, list(range(10, 19)), max_tokens=5)  # 9 prompt rows compete with 10 drafts
    _, plan = s.advance([*[41] * 5, 60, *[51] * 5, 61], [6, 6], drafts_for(plan, {1: [42] * 5, 2: [52] * 5}))
    assert plan.num_tokens == 12  # 2 decode rows + 9 prompt rows + what is left for drafts: 1
    assert plan.num_verify_drafts == 1 and plan.verify_len.tolist() == [2, 1, 1]


def test_drafts_never_preempt_and_are_capped_by_pages() -> None:
    s = make(num_pages=(7, 40), enable_prefix_cache=False)  # 28 tokens of ratio 1
    plan = prefill(s, {1: 8, 2: 8}, {1: [41] * 5, 2: [51] * 5}, max_tokens=9)
    # decode rows at position 8 take 3 pages each; the last free page holds request 1's drafts (up to
    # position 15), request 2's drafts stop at its own third page's end (position 11)
    assert plan.verify_len.tolist() == [6, 4]
    assert s.native.num_free_pages(1) == 0 and s.native.num_preemptions == 0


def test_abort_mid_verify_frees_everything() -> None:
    s = make()
    plan = prefill(s, {1: 6, 2: 5}, {1: [41] * 5, 2: [51] * 5})
    assert plan.num_verify_drafts == 10
    assert s.abort(1) and s.abort(2)
    events, plan = s.advance([-1] * 12, [0, 0])
    assert sorted((e.rid, e.reason) for e in events) == [(1, "abort"), (2, "abort")]
    assert plan.bucket == 0 and s.native.num_free_slots == 4
    assert s.native.num_used_pages(1) == s.native.num_cached_pages(1)  # only prefix-cache pages held
    assert s.native.num_idle_pages(1) == s.native.num_cached_pages(1)


def test_preemption_drops_drafts_and_pages() -> None:
    s = make()
    prefill(s, {1: 6}, {1: [41] * 5})
    events = s.update([41, 41, 60, -1, -1, -1], [3])
    assert [e.token for e in events] == [41, 41, 60]
    s.schedule()
    s.update([61], [1], drafts_for_seqs(1, {0: [70, 71]}))
    assert s.drafts_of(1) == [70, 71] and s.preempt(1)
    assert s.drafts_of(1) == [] and s.native.num_free_slots == 4
    plan = s.schedule()  # recompute prefill: no verify rows, samples the newest token again
    assert plan.verify_len.tolist() == [1] and plan.num_verify_drafts == 0


def drafts_for_seqs(seqs: int, per_seq: dict[int, list[int]]):
    tokens, lengths = np.zeros((seqs, NEXTN), np.int32), np.zeros(seqs, np.int32)
    for s, d in per_seq.items():
        tokens[s, : len(d)], lengths[s] = d, len(d)
    return tokens, lengths, None


def test_confidence_planner_choice_appears_in_plan() -> None:
    curve = make_curve([1, 2, 4, 8, 16, 32], [10.0, 10.5, 11.0, 14.0, 25.0, 50.0])
    s = make(curve, verify_mode="confidence")
    conf = {1: [0.9, 0.8, 0.7, 0.6, 0.5], 2: [0.3, 0.2, 0.9, 0.9, 0.9], 3: [0.95] * 5}
    for rid in (1, 2, 3):
        s.add_request(rid, list(range(10, 15)), max_tokens=30)
    plan = s.schedule()
    d = {r: [40 + r] * 5 for r in conf}
    plan = s.advance([7, 7, 7], None, drafts_for(plan, d, conf))[1]
    want = plan_verification([conf[r] for r in (1, 2, 3)], curve, 32 - 3)
    assert plan.verify_len.tolist() == [1 + k for k in want.drafts.tolist()]
    assert plan.num_verify_drafts == want.total_drafts > 0
    assert plan.expected_tokens == pytest.approx(want.expected_tokens)
    assert plan.predicted_ms == pytest.approx(want.step_ms)


def test_confidence_planner_weighs_the_draft_pass() -> None:
    # [0.5] * 5 on this curve: 3 drafts alone (1.875 / 11.0 beats 1.97 / 14.0); a 100 ms draft pass is
    # paid only by a plan that verifies drafts, and no drafting (1 / 10.0) beats every such plan
    # (1.97 / 114.0 at best): none
    curve = make_curve([1, 2, 4, 8, 16, 32], [10.0, 10.5, 11.0, 14.0, 25.0, 50.0])
    got = []
    for draft_ms in (0.0, 100.0):
        s = make(curve, verify_mode="confidence")
        s.native.draft_ms = draft_ms
        s.add_request(1, list(range(10, 15)), max_tokens=30)
        plan = s.schedule()
        plan = s.advance([7], None, drafts_for(plan, {1: [41] * 5}, {1: [0.5] * 5}))[1]
        want = plan_verification([[0.5] * 5], curve, 32 - 1, draft_ms=draft_ms)
        assert plan.num_verify_drafts == want.total_drafts
        got.append(plan.num_verify_drafts)
    assert got == [3, 0]
    with pytest.raises(ValueError, match=r"Scheduler.draft_ms = -1.0+; expected a finite draft pass time"):
        s.native.draft_ms = -1.0


def test_confidence_planner_counts_prefill_rows() -> None:
    curve = make_curve([1, 8, 11, 16, 32], [10.0, 10.2, 10.4, 60.0, 80.0])
    s = make(curve, verify_mode="confidence")
    s.add_request(1, list(range(10, 15)), max_tokens=30)
    plan = s.schedule()
    plan = s.advance([7], None, drafts_for(plan, {1: [41] * 5}, {1: [0.9] * 5}))[1]
    assert plan.num_verify_drafts == 5  # 6 rows cost about what 1 row costs
    s.add_request(2, list(range(10, 20)), max_tokens=30)
    rows = [41] * 5 + [60]
    plan = s.advance(rows, [6], drafts_for(plan, {1: [42] * 5}, {1: [0.9] * 5}))[1]
    # 1 + 10 prefill rows reach the curve's step at 11: any draft costs a 60 ms step, so none is verified
    want = plan_verification([[0.9] * 5], curve, 32 - 11, other_rows=10)
    assert plan.num_verify_drafts == want.total_drafts == 0


def test_confidence_mode_needs_a_curve_and_confidences() -> None:
    with pytest.raises(ValueError, match="verify_mode = CONFIDENCE needs a throughput curve"):
        make(verify_mode="confidence")
    s = make(make_curve([32], [1.0]), verify_mode="confidence")
    s.add_request(1, [1, 2, 3], max_tokens=9)
    plan = s.schedule()
    with pytest.raises(ValueError, match=r"draft_lengths\[0\] \(request 1\) = 2 without confidence"):
        s.update([7], None, drafts_for(plan, {1: [4, 5]}))


@pytest.mark.parametrize(
    ("emitted", "rows", "message"),
    [
        ([0], [41, 60, -1], r"num_emitted\[0\] \(request 1\) = 0; expected 1..3"),
        ([4], [41, 42, 60], r"num_emitted\[0\] \(request 1\) = 4; expected 1..3"),
        ([2], [99, 60, -1], r"sampled\[0\] = 99 \(request 1\) .* must be the draft 41"),
        ([2], [41, 100, -1], r"sampled\[1\] = 100 is not a token id; expected 0 <= id < 100"),
        ([1, 1], [60, -1, -1], r"num_emitted has 2 entries; expected one per sequence"),
    ],
)
def test_bad_commit_changes_nothing(emitted: list[int], rows: list[int], message: str) -> None:
    s = make()
    prefill(s, {1: 5}, {1: [41, 42]})
    with pytest.raises(ValueError, match=message):
        s.update(rows, emitted)
    assert s.update([41, 42, 60], [3]) and s.native.allocation(1).num_cached == 8


def test_drafts_rejected_when_off_or_malformed() -> None:
    s = make(verify_mode="off")
    s.add_request(1, [1, 2, 3], max_tokens=9)
    plan = s.schedule()
    with pytest.raises(ValueError, match="drafts given but SchedulerConfig.verify_mode is OFF"):
        s.update([7], None, drafts_for(plan, {1: [4]}))
    s = make()
    s.add_request(1, [1, 2, 3], max_tokens=9)
    plan = s.schedule()
    with pytest.raises(ValueError, match=r"drafts\[0\] \(request 1\)\[1\] = 100 is not a token id"):
        s.update([7], None, drafts_for(plan, {1: [4, 100]}))
    bad_conf = drafts_for(plan, {1: [4, 5]}, {1: [0.5, 1.5]})
    with pytest.raises(ValueError, match=r"confidence\[0\] \(request 1\)\[1\] = 1.5.* not a probability"):
        s.update([7], None, bad_conf)
    with pytest.raises(ValueError, match="SchedulerConfig.draft_len = 6 is outside 0..nextn = 5"):
        make(draft_len=6)


def test_fixed_draft_len() -> None:
    s = make(draft_len=2)
    plan = prefill(s, {1: 5}, {1: [41, 42, 43, 44, 45]})
    assert plan.verify_len.tolist() == [3] and plan.expected_tokens == 1.0


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_random_verify_commits_keep_rows_pages_and_pools_consistent(data: st.DataObject) -> None:
    """Random drafts, accepted prefixes and aborts: every verify plan holds the request's committed
    tokens then its drafts, a commit appends exactly the emitted tokens, and nothing leaks at the end."""
    s = make(max_num_batched_tokens=16, num_pages=(24, 16), max_model_len=40, enable_prefix_cache=False)
    tokens: dict[int, list[int]] = {}
    for rid in range(data.draw(st.integers(1, 4))):
        tokens[rid] = data.draw(st.lists(st.integers(2, 99), min_size=1, max_size=9))
        s.add_request(rid, tokens[rid], max_tokens=data.draw(st.integers(1, 12)))
    held: dict[int, list[int]] = {}
    plan = s.schedule()
    for _ in range(60):
        if plan.bucket == 0:
            break
        sampled, emitted, nexts = [], [], {}
        for k, rid in enumerate(plan.seq_rids.tolist()):
            a, n, start = int(plan.verify_start[k]), int(plan.verify_len[k]), int(plan.seq_start[k])
            rows = plan.token_ids[plan.sample_rows[a : a + n]].tolist() if n else []
            drafts = held.get(rid, [])[: max(n - 1, 0)]
            if n > 1:
                assert rows == [tokens[rid][-1], *drafts] and start == len(tokens[rid]) - 1
            m = data.draw(st.integers(1, n)) if n else 0
            out = [*drafts[: m - 1], data.draw(st.integers(2, 99))][:m]
            sampled += out + [-1] * (n - m)
            emitted.append(m)
            nexts[rid] = data.draw(st.lists(st.integers(2, 99), max_size=NEXTN)) if m else []
        events, plan_next = s.advance(sampled, emitted, drafts_for(plan, nexts))
        for e in events:
            if e.token >= 0:
                tokens[e.rid].append(e.token)
            if e.finished:
                tokens.pop(e.rid, None)
        held = {r: d for r, d in nexts.items() if r in tokens}
        for rid in tokens:
            alloc = s.native.allocation(rid)
            assert alloc.tokens == tokens[rid]
            if data.draw(st.integers(0, 20)) == 0:
                s.abort(rid)
        plan = plan_next
    while s.has_unfinished or plan.bucket:
        for rid in list(tokens):
            s.abort(rid)
        _, plan = s.advance([-1] * len(plan.sample_rows), [0] * plan.num_seqs)
    assert s.native.num_free_slots == 4
    assert all(s.page_usage(r).used == 0 for r in (1, 2))


def test_online_correction_of_the_shared_curve_reaches_the_planner() -> None:
    curve = make_curve([1, 8, 32], [10.0, 10.2, 10.5], window=50, min_samples=3)
    s = make(curve, verify_mode="confidence")
    conf = {1: [0.6] * 5}
    s.add_request(1, list(range(10, 15)), max_tokens=30)
    plan = s.schedule()
    plan = s.advance([7], None, drafts_for(plan, {1: [41] * 5}, conf))[1]
    assert plan.num_verify_drafts == 5
    for _ in range(5):  # steps of 8 rows measured at 40 ms: rows cost far more than profiled
        curve.observe(8, 40.0)
    assert curve.slope_ms > 0
    rows = [60, -1, -1, -1, -1, -1]
    plan = s.advance(rows, [1], drafts_for(plan, {1: [42] * 5}, conf))[1]
    want = plan_verification([conf[1]], curve, 32 - 1)
    assert plan.num_verify_drafts == want.total_drafts < 5
