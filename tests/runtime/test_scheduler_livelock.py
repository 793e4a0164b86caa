"""A known scheduler defect, kept as a strict xfail until it is fixed: twelve small requests sharing
prefixes end with two running requests holding every ratio-1 page (15 of 24 cached, none idle) and each
plan empty, so neither progresses and nothing is preempted. The hypothesis state machine
(test_scheduler_properties.py) found it; it fails the same way at 3b4c0d7, before the prefix-cache
bypass flag existed."""

from __future__ import annotations

import numpy as np
import pytest

from dsgraph.runtime.scheduler import Scheduler
from tests.runtime.test_scheduler_properties import CONFIG  # the machine that found it

BASE = [(7 * i + 3) % 47 + 2 for i in range(30)]


@pytest.mark.xfail(strict=True, reason="scheduler livelock: two running requests, no free page, empty plans")
def test_requests_sharing_prefixes_all_finish() -> None:
    s = Scheduler(CONFIG)
    adds = [(1, BASE[:2])] + [(1, BASE[:1])] * 7
    adds += [(9, BASE[:1]), (8, BASE[:3] + [2]), (7, BASE[:24] + [2]), (1, BASE[:23] + [2] * 6)]
    for rid, (max_tokens, prompt) in enumerate(adds):
        s.add_request(rid, prompt, max_tokens=max_tokens)
    for _ in range(400):
        if not s.has_unfinished:
            break
        plan = s.schedule()
        s.update(np.full(len(plan.sample_rows), 9, dtype=np.int32))
    assert not s.has_unfinished
