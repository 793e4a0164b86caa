"""The token events a PD engine pair exchanges as JSON lines (runtime/server/pd_loop.py)."""

from __future__ import annotations

import json
import math

from dsgraph.runtime.engine import TokenEvent
from dsgraph.runtime.server.pd_loop import event_from_json, event_json


def _strict(line: str) -> dict:
    def refuse(name: str) -> float:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def test_a_logprob_nobody_asked_for_travels_as_null_and_comes_back_nan() -> None:
    """The greedy_token sampling leaves the logprob NaN; the line must stay standard JSON."""
    event = TokenEvent(3, 17, "ab", math.nan, [], False, None, 2)
    line = event_json(event)
    assert _strict(line)["logprob"] is None
    back = event_from_json(line)
    assert math.isnan(back.logprob) and (back.rid, back.token, back.text, back.num_cached_tokens) == (
        3,
        17,
        "ab",
        2,
    )


def test_a_computed_logprob_and_its_top_ids_round_trip_exactly() -> None:
    event = TokenEvent(1, 5, "x", -0.125, [(5, -0.125), (9, -2.5)], True, "stop")
    back = event_from_json(event_json(event))
    assert back == event
