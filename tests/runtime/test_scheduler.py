"""Scheduler behaviour: validation errors name the field, stop conditions, chunked prefill, buckets and
inert padding, no starvation of waiting prompts, preemption, abort, engine types and prefix-cache hits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dsgraph.runtime.scheduler import (
    EngineType,
    Scheduler,
    SchedulerConfig,
    StepEvent,
    StepPlan,
    default_buckets,
    replay_tokens,
)


def make(**kw: Any) -> Scheduler:
    base: dict[str, Any] = dict(
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_model_len=64,
        page_size=4,
        ratios=(1, 2),
        num_pages=(32, 32),
        vocab_size=100,
    )
    return Scheduler(SchedulerConfig(**{**base, **kw}))


def step(s: Scheduler, token: int | Callable[[int], int] = 7) -> tuple[StepPlan, list[StepEvent]]:
    plan = s.schedule()
    rids = plan.sample_rids.tolist()
    sampled = [token(rid) if callable(token) else token for rid in rids]
    return plan, s.update(np.asarray(sampled, dtype=np.int32))


def run_all(s: Scheduler, token: int | Callable[[int], int] = 7, limit: int = 500) -> list[StepEvent]:
    events: list[StepEvent] = []
    for _ in range(limit):
        if not s.has_unfinished:
            return events
        events += step(s, token)[1]
    raise AssertionError(f"not finished after {limit} steps")


def prompt(n: int, first: int = 10) -> list[int]:
    return [first + i % 50 for i in range(n)]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(max_num_seqs=0), r"SchedulerConfig.max_num_seqs = 0 is not positive"),
        (dict(max_num_seqs=20), r"max_num_seqs = 20 exceeds max_num_batched_tokens = 16"),
        (dict(buckets=(4, 8)), r"buckets: the largest bucket 8 is below max_num_batched_tokens = 16"),
        (dict(buckets=(8, 4, 16)), r"BucketTable: sizes\[1\] = 4 is not greater than sizes\[0\] = 8"),
        (dict(num_pages=(4,)), r"num_pages has 1 entries; expected one per ratio in ratios \(2\)"),
        (dict(ratios=(2, 1)), r"ratios\[1\] = 1; expected positive, strictly increasing"),
        (dict(num_pages=(4, 0)), r"SchedulerConfig.num_pages\[1\] = 0 is not positive"),
        (dict(replay_tokens=-1), r"SchedulerConfig.replay_tokens = -1 is negative"),
        (dict(page_size=0), r"SchedulerConfig.page_size = 0 is not positive"),
    ],
)
def test_config_errors_name_the_field(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kw)


def test_replay_modes() -> None:
    assert replay_tokens("window", window=128, num_layers=40) == 128
    assert replay_tokens("exact", window=128, num_layers=40) == 5120
    assert replay_tokens(7, window=128, num_layers=40) == 7
    with pytest.raises(ValueError, match=r"replay: 'full' must be"):
        replay_tokens("full", window=128, num_layers=40)  # type: ignore[arg-type]
    assert default_buckets(12) == (1, 2, 4, 8, 12) and default_buckets(1) == (1,)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(prompt=prompt(65)), r"add_request: prompt has 65 tokens, longer than max_model_len = 64"),
        (dict(prompt=[5, 6, -1]), r"add_request: prompt\[2\] = -1 is not a token id; expected 0 <= id < 100"),
        (dict(prompt=[5, 100]), r"prompt\[1\] = 100 is not a token id"),
        (dict(prompt=[]), r"add_request: prompt is empty"),
        (dict(max_tokens=0), r"add_request: max_tokens = 0; expected >= 1"),
        (dict(eos_id=-2), r"add_request: eos_id = -2; expected -1 \(none\) or a token id"),
        (dict(stop_token_ids=[3, -4]), r"add_request: stop_token_ids\[1\] = -4 is not a token id"),
        (dict(prompt=[2**31]), r"prompt: token id 2147483648 is outside the int32 range"),
        (dict(prompt=[1.5]), r"prompt: expected integer token ids"),
    ],
)
def test_bad_requests_name_the_field(kw: dict[str, Any], message: str) -> None:
    s = make()
    args: dict[str, Any] = dict(prompt=[5, 6, 7], max_tokens=4)
    with pytest.raises(ValueError, match=message):
        s.add_request(0, **{**args, **kw})
    assert s.native.num_requests == 0


def test_rid_in_use_and_requests_larger_than_the_pool() -> None:
    s = make(num_pages=(8, 32))
    s.add_request(3, [5, 6], max_tokens=2)
    with pytest.raises(ValueError, match=r"add_request: rid = 3 is already in use"):
        s.add_request(3, [5, 6], max_tokens=2)
    with pytest.raises(ValueError, match=r"can need 9 pages of ratio 1 .* the pool has 8"):
        s.add_request(4, prompt(30), max_tokens=7)  # 36 rows fed: 9 pages of 4 entries


def test_update_rejects_bad_tokens_without_changing_state() -> None:
    s = make()
    s.add_request(0, [5, 6, 7], max_tokens=3)
    plan = s.schedule()
    with pytest.raises(ValueError, match=r"sampled\[0\] = -3 is not a token id; expected 0 <= id < 100"):
        s.update(np.asarray([-3], dtype=np.int32))
    with pytest.raises(ValueError, match=r"sampled has 2 tokens; expected 1 \(one per sample row of step 1"):
        s.update(np.asarray([1, 2], dtype=np.int32))
    assert plan.sample_rids.tolist() == [0]
    assert s.update(np.asarray([9], dtype=np.int32)) == [StepEvent(0, 9, False, None)]


def test_schedule_and_update_alternate() -> None:
    s = make()
    with pytest.raises(RuntimeError, match=r"update: no plan in flight; call schedule\(\) first"):
        s.update([])
    s.schedule()
    with pytest.raises(RuntimeError, match=r"schedule: the plan of step 1 was not committed"):
        s.schedule()
    assert s.update([]) == []


@pytest.mark.parametrize(
    ("kw", "tokens", "outputs", "reason"),
    [
        (dict(max_tokens=5, eos_id=9), [3, 9, 4], [3, 9], "stop"),
        (dict(max_tokens=3, eos_id=9, ignore_eos=True), [9, 9, 9, 9], [9, 9, 9], "length"),
        (dict(max_tokens=5, eos_id=9, ignore_eos=True, stop_token_ids=[4]), [9, 4], [9, 4], "stop"),
        (dict(max_tokens=4), [1, 2, 3, 4, 5], [1, 2, 3, 4], "length"),
        (dict(max_tokens=50), [1] * 60, [1] * 4, "length"),  # 60-token prompt: max_model_len 64
    ],
)
def test_stop_conditions(kw: dict[str, Any], tokens: list[int], outputs: list[int], reason: str) -> None:
    s = make()
    s.add_request(0, prompt(60 if kw["max_tokens"] == 50 else 3), **kw)
    queue = iter(tokens)
    events = run_all(s, lambda _rid: next(queue))
    assert [e.token for e in events] == outputs
    assert [e.finished for e in events] == [False] * (len(outputs) - 1) + [True]
    assert events[-1].reason == reason and events[-1].rid == 0
    assert s.native.num_requests == 0 and s.native.num_free_slots == 4


def test_prompt_of_max_model_len_gives_one_token() -> None:
    s = make()
    s.add_request(0, prompt(64), max_tokens=10)
    assert run_all(s)[-1] == StepEvent(0, 7, True, "length")


def test_chunked_prefill_samples_only_the_last_chunk() -> None:
    s = make()
    s.add_request(0, prompt(40), max_tokens=2)
    plans = [step(s)[0] for _ in range(4)]
    spans = [(int(p.seq_start[0]), int(p.seq_end[0])) for p in plans]
    assert spans == [(0, 16), (16, 32), (32, 40), (40, 41)]
    assert [p.sample_rows.tolist() for p in plans] == [[], [], [7], [0]]
    assert [p.bucket for p in plans] == [16, 16, 8, 1]
    assert plans[1].positions.tolist() == list(range(16, 32))
    assert plans[1].lookback.tolist() == [[prompt(40)[15], prompt(40)[14], prompt(40)[13]]]
    assert plans[0].lookback.tolist() == [[-1, -1, -1]]
    assert plans[1].block_table(1).tolist() == [list(range(8)) + [-1] * 8]  # 32 entries, 16 pages wide
    assert plans[1].block_table(2).tolist() == [list(range(4)) + [-1] * 4]


def test_max_chunk_caps_one_requests_prefill_steps_and_leaves_the_rest_of_the_budget() -> None:
    s = make()
    s.add_request(0, prompt(20), max_tokens=2, max_chunk=6)  # a router's chunk size
    s.add_request(1, prompt(12, first=30), max_tokens=3)
    plans = [step(s)[0] for _ in range(4)]
    spans = [[(int(a), int(b)) for a, b in zip(p.seq_start, p.seq_end, strict=True)] for p in plans]
    # request 0 takes 6 tokens a step; request 1 fills the 16-token budget's rest, then decodes (decode
    # rows come first in a step)
    assert spans == [[(0, 6), (0, 10)], [(6, 12), (10, 12)], [(12, 13), (12, 18)], [(13, 14), (18, 20)]]
    with pytest.raises(ValueError, match=r"max_chunk -1, expected >= 0"):
        s.add_request(2, prompt(4), max_tokens=2, max_chunk=-1)


def test_bucket_is_smallest_fitting_and_padding_is_inert() -> None:
    s = make(buckets=(2, 4, 8, 16))
    s.add_request(0, [5, 6, 7], max_tokens=2)
    s.add_request(1, [8, 9], max_tokens=2)
    plan, _ = step(s)
    assert (plan.num_tokens, plan.bucket) == (5, 8)
    assert plan.seq_ids.tolist() == [0, 0, 0, 1, 1, -1, -1, -1]
    assert plan.token_ids.tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert plan.positions.tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert plan.is_replay.tolist() == [0] * 8
    assert plan.sample_rows.tolist() == [2, 4] and plan.seq_rids.tolist() == [0, 1]
    plan, _ = step(s)
    assert (plan.num_tokens, plan.bucket, plan.num_decode) == (2, 2, 2)


def test_plan_arrays_are_read_only_views_that_outlive_the_plan() -> None:
    s = make()
    s.add_request(0, [5, 6, 7], max_tokens=2)
    tokens = s.schedule().token_ids  # the plan object itself is gone
    assert tokens[:3].tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="read-only"):
        tokens[0] = 1


def test_waiting_prompts_join_while_others_decode() -> None:
    s = make(max_num_batched_tokens=8, buckets=(8,))
    for rid in range(3):
        s.add_request(rid, [5 + rid], max_tokens=40)
    step(s)
    for _ in range(5):
        plan, _ = step(s)
        assert plan.num_decode == 3 and plan.num_seqs == 3
    s.add_request(9, prompt(12), max_tokens=2)
    plan, _ = step(s)  # the very next step: 3 decode rows, then the new prompt's first chunk
    assert plan.seq_rids.tolist() == [0, 1, 2, 9] and plan.num_decode == 3
    assert (int(plan.seq_start[3]), int(plan.seq_end[3])) == (0, 5) and plan.num_tokens == 8
    plan, _ = step(s)
    assert (int(plan.seq_start[3]), int(plan.seq_end[3])) == (5, 10)


def test_prefill_budget_goes_to_requests_in_arrival_order() -> None:
    s = make()
    for rid in range(3):
        s.add_request(rid, prompt(10, 20 * rid), max_tokens=2)
    plan, _ = step(s)
    assert plan.seq_rids.tolist() == [0, 1] and plan.seq_end.tolist() == [10, 6]
    plan, _ = step(s)  # the partial prompt continues before the next one starts
    assert plan.seq_rids.tolist() == [0, 1, 2] and plan.num_decode == 1
    assert plan.seq_start.tolist() == [10, 6, 0] and plan.seq_end.tolist() == [11, 10, 10]


def test_a_request_short_of_pages_is_not_overtaken() -> None:
    s = make(num_pages=(6, 32))
    s.add_request(0, prompt(19), max_tokens=5)  # 5 of 6 ratio-1 pages after its prefill, 6 at row 20
    step(s)
    step(s)
    s.add_request(1, prompt(16, 30), max_tokens=2)
    s.add_request(2, [5], max_tokens=2)
    plan, _ = step(s)  # request 1 shrinks to the one page left; request 2 gets none
    assert plan.seq_rids.tolist() == [0, 1] and (int(plan.seq_start[1]), int(plan.seq_end[1])) == (0, 4)
    plan, _ = step(s)  # request 0's sixth page: request 1 (admitted last) is preempted
    assert plan.seq_rids.tolist() == [0] and plan.preempted.tolist() == [1] and s.num_waiting == 2
    while (plan := step(s)[0]).num_seqs == 1 and plan.seq_rids[0] == 0:
        pass
    assert plan.seq_rids.tolist() == [1] and s.num_waiting == 1  # 16 rows of budget: request 1 first


def test_preemption_victim_is_the_most_recently_admitted_and_resumes() -> None:
    s = make(num_pages=(7, 32), max_num_batched_tokens=16)
    s.add_request(0, prompt(8), max_tokens=20)  # grows to 27 rows: 7 pages
    s.add_request(1, prompt(8, 30), max_tokens=6)
    s.add_request(2, prompt(4, 40), max_tokens=12)
    outputs: dict[int, list[int]] = {0: [], 1: [], 2: []}
    preempted: list[int] = []
    for _ in range(200):
        if not s.has_unfinished:
            break
        plan, events = step(s, lambda rid: rid + 1)
        preempted += plan.preempted.tolist()
        for e in events:
            outputs[e.rid].append(e.token)
    assert preempted and preempted[0] == 2  # admitted last
    assert s.native.num_preemptions == len(preempted)
    assert outputs == {0: [1] * 20, 1: [2] * 6, 2: [3] * 12}  # resumed requests keep their outputs
    assert s.native.num_free_pages(1) + len(s.native.cached_pages(1)) == 7


def test_preempted_request_recomputes_prompt_and_outputs() -> None:
    s = make()
    s.add_request(0, [5, 6, 7], max_tokens=5)
    step(s, 11)
    step(s, 12)
    assert s.preempt(0) and not s.preempt(0) and s.num_waiting == 1
    plan, events = step(s, 13)
    assert plan.token_ids[: plan.num_tokens].tolist() == [5, 6, 7, 11, 12]
    assert plan.seq_window_start.tolist() == [0]  # no prefix hit: its SWA keys from position 0
    assert plan.sample_rows.tolist() == [4] and events == [StepEvent(0, 13, False, None)]


def test_abort_anywhere_frees_everything() -> None:
    s = make()
    for rid in range(3):
        s.add_request(rid, prompt(10), max_tokens=5)
    step(s)
    s.add_request(7, [5], max_tokens=5)
    assert s.abort(7) and not s.abort(8)  # waiting
    plan = s.schedule()
    assert s.abort(1)  # planned: its caches stay held until the step is committed
    assert s.native.num_free_slots == 1
    events = s.update(np.full(len(plan.sample_rows), 3, dtype=np.int32))
    assert events[:2] == [StepEvent(7, -1, True, "abort"), StepEvent(1, -1, True, "abort")]
    assert [e.rid for e in events[2:]] == [0, 2] and s.native.num_free_slots == 2
    assert s.abort(0) and s.abort(2)
    assert step(s)[1] == [StepEvent(0, -1, True, "abort"), StepEvent(2, -1, True, "abort")]
    assert s.native.num_free_slots == 4 and not s.has_unfinished
    for r in (1, 2):
        assert s.native.num_used_pages(r) == s.native.num_cached_pages(r) == s.native.num_idle_pages(r)


def test_prompt_engine_hands_off_caches() -> None:
    s = make(engine_type=EngineType.PROMPT)
    s.add_request(0, prompt(10), max_tokens=8)
    s.add_request(1, prompt(6, 30), max_tokens=1)
    _, events = step(s, 42)
    assert events == [StepEvent(0, 42, True, "prefilled"), StepEvent(1, 42, True, "length")]
    assert not s.has_unfinished and s.native.num_handoff == 1
    alloc = s.handoff(0)
    assert (alloc.num_cached, alloc.tokens) == (10, prompt(10) + [42])
    assert [len(p) for p in alloc.pages] == [3, 2] and alloc.slot == 0
    with pytest.raises(ValueError, match=r"handoff: rid = 1 has no finished prompt"):
        s.handoff(1)
    with pytest.raises(ValueError, match=r"add_prefilled: a PROMPT engine does not decode"):
        s.add_prefilled(5, [1, 2], [3], max_tokens=4)
    s.release_handoff(0)
    assert s.native.num_free_slots == 4 and s.native.num_requests == 0


def test_completion_engine_decodes_prefilled_requests() -> None:
    s = make(engine_type=EngineType.COMPLETION, num_pages=(6, 32))
    with pytest.raises(ValueError, match=r"add_request: a COMPLETION engine only decodes"):
        s.add_request(0, [1, 2], max_tokens=3)
    alloc = s.add_prefilled(0, prompt(10), [42], max_tokens=4)
    assert (alloc.num_cached, [len(p) for p in alloc.pages]) == (10, [3, 2])
    plan, events = step(s, 5)
    assert (int(plan.seq_start[0]), plan.token_ids[0]) == (10, 42)
    assert events == [StepEvent(0, 5, False, None)]
    alloc = s.add_prefilled(1, prompt(12, 30), [1], max_tokens=9)  # 3 pages: all that is left
    assert not s.native.can_add_prefilled(1)
    with pytest.raises(RuntimeError, match=r"add_prefilled: no room for request 2"):
        s.add_prefilled(2, [3], [4], max_tokens=3)
    events = run_all(s, 5)  # no recompute on a COMPLETION engine: the victim is aborted
    assert StepEvent(1, -1, True, "abort") in events and events[-1] == StepEvent(0, 5, True, "length")
    with pytest.raises(ValueError, match=r"expected 1 <= len\(output\) < max_tokens = 4"):
        s.add_prefilled(3, [3], [], max_tokens=4)


def test_prefix_cache_hits_on_a_crafted_workload() -> None:
    s = make(replay_tokens=4)  # grain lcm(4 * 1, 4 * 2) = 8 tokens
    shared = prompt(17)
    s.add_request(0, shared + [90, 91, 92], max_tokens=2)  # 20 tokens: pages of 16 cached for both ratios
    run_all(s)
    assert (s.native.prefix_lookup_tokens, s.native.prefix_hit_tokens) == (20, 0)
    assert s.native.num_cached_pages(1) == 5 and s.native.num_cached_pages(2) == 2
    s.add_request(1, shared + [80], max_tokens=3)  # shares 17 tokens: hit 16
    plan, _ = step(s)
    assert (s.native.prefix_lookup_tokens, s.native.prefix_hit_tokens) == (38, 16)
    assert (int(plan.seq_start[0]), int(plan.seq_end[0])) == (12, 18)  # 4 replayed rows, then 2 new
    assert plan.is_replay.tolist()[:6] == [1, 1, 1, 1, 0, 0]
    assert plan.lookback.tolist() == [shared[11:8:-1]]
    assert s.native.num_replayed_tokens == 4
    alloc = s.native.allocation(1)
    assert [len(p) for p in alloc.pages] == [5, 3]  # 18 rows: 9 ratio-2 entries
    assert alloc.pages[0][:4] == s.native.cached_pages(1)[:4]  # shared, reference count 2
    assert all(s.native.page_refcounts(1)[p] == 2 for p in alloc.pages[0][:4])
    assert plan.seq_window_start.tolist() == [12]  # attention reads no SWA key below the replay start
    plan, _ = step(s)  # a decode row: the request still holds no SWA key below 12
    assert plan.num_decode == 1 and plan.seq_window_start.tolist() == [12]
    run_all(s)
    s.add_request(2, [1, 2, 3] + shared, max_tokens=2)  # same tokens at other positions: no hit
    plan, _ = step(s)
    assert plan.seq_window_start.tolist() == [0]
    run_all(s)
    assert s.native.prefix_hit_tokens == 16
    s.add_request(3, shared + [70, 71, 72, 73], max_tokens=3)  # hit 16, replay from 12
    step(s)
    assert s.preempt(3)
    plan, _ = step(s)  # readmitted: a new hit (the same 16), so its window starts at 12 again
    assert int(plan.seq_start[0]) == 12 and plan.seq_window_start.tolist() == [12]


def test_whole_prompt_hit_still_computes_its_last_token() -> None:
    s = make(replay_tokens=0)
    s.add_request(0, prompt(16), max_tokens=1)
    run_all(s)
    s.add_request(1, prompt(16), max_tokens=3)
    plan, _ = step(s)
    assert s.native.prefix_hit_tokens == 16
    assert (int(plan.seq_start[0]), int(plan.seq_end[0])) == (14, 16)  # last token, on a ratio-2 boundary
    assert plan.is_replay[:2].tolist() == [1, 1] and plan.sample_rows.tolist() == [1]


def test_prefix_cache_off_never_hits_and_caches_nothing() -> None:
    s = make(enable_prefix_cache=False)
    for rid in range(2):
        s.add_request(rid, prompt(20), max_tokens=2)
        run_all(s)
    assert s.native.prefix_hit_tokens == 0 and s.native.num_cached_pages(1) == 0
    assert s.page_usage(1) == (32, 32, 0, 0, 0)


def test_idle_cached_pages_are_evicted_under_pressure() -> None:
    s = make(num_pages=(8, 8))
    s.add_request(0, prompt(16), max_tokens=1)
    run_all(s)
    assert s.page_usage(1).idle == 4
    s.add_request(1, prompt(28, 60), max_tokens=1)  # 7 pages: 4 free, 3 evicted
    run_all(s)
    assert s.native.num_cached_pages(1) == 1 + 7
