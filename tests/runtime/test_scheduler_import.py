"""Scheduler.prefix_pages / import_prefix: a prompt's prefix pages computed elsewhere (the KV store) enter
the prefix cache as idle cached pages, the request that then arrives is admitted with that prefix hit,
pages cached already are not duplicated, and an import stops at the first page it cannot get without
evicting its own chain."""

from __future__ import annotations

import numpy as np

from tests.runtime.test_scheduler import make, prompt, run_all


def _ids(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def test_imported_pages_are_a_prefix_hit_at_admission() -> None:
    s = make()  # page_size 4, ratios (1, 2): ratio-1 pages hold 4 tokens, ratio-2 pages 8; grain 8
    p = _ids(prompt(20))
    assert s.native.prefix_pages(p) == [[], []]
    pages = s.native.import_prefix(p, [4, 2])
    assert [len(x) for x in pages] == [4, 2] and all(page >= 0 for x in pages for page in x)
    assert s.native.prefix_pages(p) == pages
    assert s.page_usage(1).idle == 4 and s.page_usage(2).idle == 2  # cached, no user: evictable
    again = s.native.import_prefix(p, [5, 2])  # what is cached comes back as -1, only the rest is new
    assert again[0][:4] == [-1] * 4 and again[0][4] >= 0 and again[1] == [-1, -1]
    s.add_request(0, p, max_tokens=2)
    plan = s.schedule()
    assert int(plan.seq_start[0]) == 16  # 5 ratio-1 and 2 ratio-2 pages: a 16-token hit (no replay)
    assert plan.num_tokens == 4
    s.update(np.asarray([7], dtype=np.int32))
    run_all(s)
    assert s.native.prefix_hit_tokens == 16


def test_an_import_stops_where_no_page_is_left() -> None:
    s = make(max_model_len=32, num_pages=(8, 4))
    p = _ids(prompt(32))
    assert [len(x) for x in s.native.import_prefix(p, [8, 4])] == [8, 4]
    other = _ids(prompt(32, first=60))
    got = s.native.import_prefix(other, [8, 4])  # evicts p's idle pages, never its own chain's
    assert [len(x) for x in got] == [8, 4] and s.native.prefix_pages(p) == [[], []]
    assert s.native.prefix_pages(other) == got
    # a running request holds pages: the import gets only what is free or idle, then stops
    s.add_request(0, _ids(prompt(31, first=5)), max_tokens=1)
    s.schedule()  # admitted with its first 16-token chunk: 4 ratio-1 and 2 ratio-2 pages held
    third = s.native.import_prefix(_ids(prompt(32, first=30)), [8, 4])
    assert [len(x) for x in third] == [4, 2] and all(page >= 0 for x in third for page in x)
