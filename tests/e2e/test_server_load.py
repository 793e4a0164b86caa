"""A smaller run of tools/bench/server_hostile.py's load (the committed result has 256 streams): good
streams amid hostile traffic, none lost, no unexpected 5xx, every output as when run alone."""

from __future__ import annotations

import pytest

from dsgraph.tools.bench.server_hostile import load, tiny_server


@pytest.mark.slow
def test_good_streams_amid_hostile_traffic_are_unaffected() -> None:
    with tiny_server(max_num_seqs=8, max_body_bytes=256 * 1024) as (url, state):
        result = load(url, streams=24, hostile=32, max_body=256 * 1024)
        assert result["lost"] == 0, result
        assert result["unexpected_5xx"] == 0, result
        assert result["outputs_differing_from_alone"] == 0, result
        outcomes = result["hostile_outcomes"]
        # every hostile request got its expected status, or (an oversized body) its connection cut at the 413
        assert outcomes.get("expected", 0) + outcomes.get("closed-by-server", 0) == 32, result
        assert outcomes["left-mid-stream"] == outcomes["left-while-sending"] == 4, result
        assert state.loop.error is None
