"""Zero-overhead scheduling on a PROMPT engine (overlap "on"): the pair gives the NORMAL engine's tokens
exactly as without overlap, nothing stays held, and the overlap benchmark runs at a tiny size on CPU
(its first tokens must agree between overlap on and off)."""

from __future__ import annotations

import json
from pathlib import Path

from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.tools.bench.pd_overlap import main
from tests.e2e.serve_util import held_pages
from tests.kvstore.pd_util import engine, normal_tokens, pair_tokens

LONG = [(3 * i + 5) % 200 + 5 for i in range(45)]
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=99, max_tokens=6, ignore_eos=True)


def test_an_overlapped_prompt_engine_hands_off_the_same_requests() -> None:
    p, c = engine("prompt", overlap="on"), engine("completion")
    assert p.overlap is not None
    ahead = p.scheduler.advance_ahead
    calls: list[int] = []
    p.scheduler.advance_ahead = lambda sampled: calls.append(1) or ahead(sampled)  # type: ignore[method-assign]
    want = normal_tokens(engine("normal", overlap="off"), LONG, SEEDED)
    for rid in range(2):
        assert pair_tokens(p, c, LONG, SEEDED, rid=rid) == want
    one = SamplingParams(temperature=0.0, max_tokens=1)  # ends on the prompt engine
    p.add_request(5, LONG, one)
    events = []
    while p.has_unfinished:
        events += p.step()
    assert [e.finish_reason for e in events] == ["length"] and events[0].handoff is None
    p.release(5)
    assert held_pages(p) == {1: 0, 2: 0} and p.scheduler.native.num_handoff == 0
    assert len(calls) >= 4  # the steps ran overlapped (commit ahead, resolve one step later)


def test_the_overlap_bench_runs_tiny(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    main(["--lengths", "40", "--requests", "2", "--chunk", "32", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["requests"] == 2 and row["overlap_on_s"] > 0 and row["speedup"] > 0
