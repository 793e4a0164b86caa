"""Hypothesis state machine over the scheduler: random add / step / abort / abort-in-flight / preempt
operations (25 runs of up to 50: about 1,200 operations) on pools small enough that preemption,
prefix hits and eviction happen. After every operation: no slot or page is owned twice, every page's
reference count is its holders plus the prefix cache, free + used == total; every plan is well formed
(smallest bucket, inert padding, rows equal to the requests' tokens, block tables equal to their
pages). At the end, everything finishes and nothing leaks."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsgraph.runtime.scheduler import Scheduler, SchedulerConfig, StepPlan

CONFIG = SchedulerConfig(
    max_num_seqs=3,
    max_num_batched_tokens=8,
    max_model_len=40,
    page_size=2,
    ratios=(1, 2),
    num_pages=(24, 16),
    num_slots=4,
    buckets=(1, 2, 4, 8),
    vocab_size=50,
    replay_tokens=2,
)
EOS = 1
BASE = [(7 * i + 3) % 47 + 2 for i in range(30)]  # prompts share prefixes of this list: prefix hits

prompts = st.builds(
    lambda cut, tail: BASE[:cut] + tail,
    st.integers(0, 24),
    st.lists(st.integers(2, 49), max_size=6),
).filter(bool)


def check_plan(plan: StepPlan, tokens: dict[int, list[int]], pages: dict[int, list[list[int]]]) -> None:
    """The plan against the requests' tokens before it and their pages after it was made."""
    n, sizes = plan.num_tokens, CONFIG.buckets or ()
    assert plan.bucket == (min(b for b in sizes if b >= n) if n else 0)
    assert n <= CONFIG.max_num_batched_tokens and plan.num_seqs <= CONFIG.max_num_seqs
    assert plan.seq_ids[n:].tolist() == [-1] * (plan.bucket - n)
    assert not plan.token_ids[n:].any() and not plan.positions[n:].any() and not plan.is_replay[n:].any()
    rids = plan.seq_rids.tolist()
    assert len(set(rids)) == len(rids)
    row, last_rows = 0, []
    for s, rid in enumerate(rids):
        start, end = int(plan.seq_start[s]), int(plan.seq_end[s])
        assert (end - start == 1) if s < plan.num_decode else end > start
        assert plan.seq_ids[row : row + end - start].tolist() == [s] * (end - start)
        assert plan.positions[row : row + end - start].tolist() == list(range(start, end))
        assert plan.token_ids[row : row + end - start].tolist() == tokens[rid][start:end]
        if end == len(tokens[rid]):
            last_rows.append(row + end - start - 1)
        row += end - start
        for k, r in enumerate(CONFIG.ratios):
            table = plan.block_table(r)[s].tolist()
            assert table == pages[rid][k] + [-1] * (len(table) - len(pages[rid][k]))
    assert row == n and plan.sample_rows.tolist() == last_rows


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = Scheduler(CONFIG)
        self.live: set[int] = set()
        self.next_rid = 0
        self.aborted: set[int] = set()  # aborted, event not reported yet

    def step(self, data: st.DataObject, abort_one: bool = False) -> None:
        n = self.s.native
        tokens = {rid: n.allocation(rid).tokens for rid in self.live}
        before = {rid: n.allocation(rid).pages for rid in self.live}
        plan = self.s.schedule()
        pages = {rid: n.allocation(rid).pages for rid in self.live}
        for rid in self.live - set(plan.preempted.tolist()):  # pages only grow, at the end
            assert all(p[: len(b)] == b for p, b in zip(pages[rid], before[rid], strict=True))
        check_plan(plan, tokens, pages)
        aborted = None
        if abort_one and plan.num_seqs:
            aborted = int(data.draw(st.sampled_from(plan.seq_rids.tolist()), label="abort planned"))
            assert self.s.abort(aborted)
        outs = len(plan.sample_rows)
        sampled = data.draw(st.lists(st.sampled_from([EOS, 5, 9, 30]), min_size=outs, max_size=outs))
        events = self.s.update(np.asarray(sampled, dtype=np.int32))
        if aborted is not None:
            self.live.discard(aborted)
            self.aborted.add(aborted)
        reported = {e.rid for e in events if e.reason == "abort"}
        assert reported == self.aborted and all(e.token == -1 for e in events if e.reason == "abort")
        self.aborted.clear()
        for rid, token, finished, reason in events:
            if reason != "abort":
                assert rid in self.live and token >= 0 and finished == (reason is not None)
            if finished:
                self.live.discard(rid)

    @rule(prompt=prompts, max_tokens=st.integers(1, 12), use_eos=st.booleans())
    def add(self, prompt: list[int], max_tokens: int, use_eos: bool) -> None:
        self.s.add_request(self.next_rid, prompt, max_tokens=max_tokens, eos_id=EOS if use_eos else -1)
        self.live.add(self.next_rid)
        self.next_rid += 1

    @rule(data=st.data())
    def schedule_and_update(self, data: st.DataObject) -> None:
        self.step(data)

    @rule(data=st.data())
    def abort_while_planned(self, data: st.DataObject) -> None:
        self.step(data, abort_one=True)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        assert self.s.abort(rid)  # the event comes with the next update
        self.live.discard(rid)
        self.aborted.add(rid)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        admitted = self.s.native.allocation(rid).slot >= 0
        assert self.s.preempt(rid) == admitted
        after = self.s.native.allocation(rid)
        assert after.slot == -1 and after.pages == [[], []] and after.num_cached == 0

    @invariant()
    def ownership(self) -> None:
        n = self.s.native
        slots = [n.allocation(rid).slot for rid in self.live]
        held = [slot for slot in slots if slot >= 0]
        assert len(held) == len(set(held)), "a slot is owned twice"
        assert n.num_free_slots + len(held) == CONFIG.num_slots
        for k, r in enumerate(CONFIG.ratios):
            holders = Counter(p for rid in self.live for p in n.allocation(rid).pages[k])
            cached = set(n.cached_pages(r))
            assert all(holders[p] <= 1 for p in holders if p not in cached), "a private page is owned twice"
            counts = n.page_refcounts(r)
            expected = [holders[p] + (p in cached) for p in range(CONFIG.num_pages[k])]
            assert counts.tolist() == expected
            assert n.num_free_pages(r) == expected.count(0)
            assert n.num_free_pages(r) + n.num_used_pages(r) == CONFIG.num_pages[k]
            assert n.num_idle_pages(r) == sum(1 for p in cached if holders[p] == 0)

    def teardown(self) -> None:
        n = self.s.native
        for _ in range(400):
            if not self.s.has_unfinished:
                break
            plan = self.s.schedule()
            self.s.update(np.full(len(plan.sample_rows), 9, dtype=np.int32))
        assert not self.s.has_unfinished and n.num_requests == 0
        assert n.num_free_slots == CONFIG.num_slots
        for r in CONFIG.ratios:
            counts = n.page_refcounts(r)
            cached = n.cached_pages(r)
            assert counts[cached].tolist() == [1] * len(cached)  # only the cache's own reference
            assert int(counts.sum()) == len(cached) == n.num_idle_pages(r)


# derandomize: the same 25 runs every time, so a CI result is reproducible. The livelock this machine
# once found at random is kept as its own strict xfail (test_scheduler_livelock.py) until it is fixed.
SchedulerMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=50, deadline=None, derandomize=True
)
TestSchedulerMachine = SchedulerMachine.TestCase


def test_the_machine_exercises_preemption_hits_and_eviction() -> None:
    """One fixed long run: the pools are small enough for every path the invariants are meant to cover."""
    s = Scheduler(CONFIG)
    rng = np.random.default_rng(0)
    for rid in range(40):
        cut = int(rng.integers(0, 25))
        s.add_request(rid, BASE[:cut] + [int(t) for t in rng.integers(2, 50, 3)], max_tokens=12)
    for _ in range(1000):
        if not s.has_unfinished:
            break
        plan = s.schedule()
        s.update(np.full(len(plan.sample_rows), 9, dtype=np.int32))
    n = s.native
    assert not s.has_unfinished
    assert n.num_preemptions > 0 and n.prefix_hit_tokens > 0 and n.num_replayed_tokens > 0
    assert n.num_evicted_pages(1) > 0 and n.num_free_pages(1) == 24 - n.num_cached_pages(1)
