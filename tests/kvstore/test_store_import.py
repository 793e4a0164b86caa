"""A store hit skips prefill: a prompt prefilled on engine A (its full pages written through to the shared
store directory) is a store hit for engine B, whose device pages lack it. B reads the blocks on a store
thread, adopts them into its prefix cache and prefills only the rest (plus the exact SWA replay), with a
cold engine's tokens and logprobs. A slow disk read never holds up B's steps: other requests run and
finish meanwhile; an aborted waiter holds nothing; a corrupt block only shortens the hit."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dsgraph.runtime.kvstore.config import StoreConfig
from dsgraph.runtime.kvstore.store import TieredStore
from dsgraph.runtime.sampling_params import SamplingParams
from tests.e2e.serve_util import held_pages
from tests.kvstore.pd_util import engine, run_all

# 100 tokens: 6 full ratio-1 pages (16 tokens), 3 full ratio-2 pages (32): a 96-token hit. The tiny
# model's exact replay is window 8 x 6 layers = 48 tokens, so a hit computes rows 48..99 only.
PROMPT = [(11 * i + 7) % 190 + 5 for i in range(100)]
HIT, REPLAY = 96, 48
OTHER = [9, 8, 7, 6, 5]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)


def _run(e: Any, rid: int, prompt: list[int]) -> tuple[list[int], list[float], int, int]:
    """(tokens, logprobs, prompt rows computed before the first token, num_cached_tokens)."""
    rows: list[int] = []
    count = e.begin_step

    def counting(plan: Any) -> None:
        rows.append(int(plan.num_tokens))
        count(plan)

    e.begin_step = counting
    e.add_request(rid, prompt, PARAMS)
    events = [ev for ev in run_all(e) if ev.rid == rid]
    e.begin_step = count
    e.release(rid)
    first = next(i for i, ev in enumerate(events) if ev.token >= 0)
    tokens = [ev.token for ev in events if ev.token >= 0]
    return (
        tokens,
        [ev.logprob for ev in events if ev.token >= 0],
        sum(rows[: first + 1]),
        events[0].num_cached_tokens,
    )


@pytest.fixture(scope="module")
def cold() -> tuple[list[int], list[float]]:
    tokens, logprobs, rows, cached = _run(engine("normal"), 0, PROMPT)
    assert rows == len(PROMPT) and cached == 0
    return tokens, logprobs


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store directory holding PROMPT's full pages, written through by a NORMAL engine."""
    root = tmp_path_factory.mktemp("kv")
    a = engine("normal", store=TieredStore(StoreConfig(path=str(root))))
    _run(a, 0, PROMPT)
    a.store_import.flush(30)
    assert a.store_import.stats.written == 9  # 6 ratio-1 + 3 ratio-2 pages
    return root


def test_store_hit_prefills_only_the_suffix_with_cold_tokens(cold, written: Path) -> None:  # type: ignore[no-untyped-def]
    b = engine("normal", store=TieredStore(StoreConfig(path=str(written))))
    tokens, logprobs, rows, cached = _run(b, 0, PROMPT)
    assert (tokens, logprobs) == cold
    assert cached == HIT and rows == len(PROMPT) - (HIT - REPLAY)
    assert b.store_import.stats.pages == 9 and b.store_import.stats.tokens == HIT
    assert b.store_import.store.metrics()["disk"]["hits"] == 9
    # the second time the pages are B's own: no store read, the same hit
    tokens, _, rows, cached = _run(b, 1, PROMPT)
    assert tokens == cold[0] and cached == HIT and b.store_import.stats.requests == 1
    assert held_pages(b) == {1: 0, 2: 0}


class _GatedStore(TieredStore):
    """Disk reads wait for `gate` (a slow SSD); a bug that made a step wait fails instead of hanging."""

    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        self.gate = threading.Event()
        inner = self.disk.get  # type: ignore[union-attr]

        def slow(key: str) -> Any:
            assert self.gate.wait(30), "the gate was never opened"
            return inner(key)

        self.disk.get = slow  # type: ignore[union-attr, method-assign]


def test_a_slow_store_read_never_holds_up_a_step(cold, written: Path) -> None:  # type: ignore[no-untyped-def]
    store = _GatedStore(StoreConfig(path=str(written)))
    b = engine("normal", store=store)
    b.add_request(0, PROMPT, PARAMS)  # waits for its blocks
    b.add_request(1, OTHER, PARAMS)  # no hit: runs at once
    b.add_request(2, PROMPT, PARAMS)  # waits too, then is aborted
    assert set(b.store_import.pending) == {0, 2} and b.scheduler.num_waiting == 1
    b.abort(2)
    events = []
    while not any(e.rid == 1 and e.finished for e in events):
        events += b.step()
    assert not any(e.rid == 0 for e in events) and 0 in b.store_import.pending
    store.gate.set()
    events += run_all(b)
    got = [e.token for e in events if e.rid == 0 and e.token >= 0]
    assert got == cold[0] and not any(e.rid == 2 for e in events)
    assert next(e for e in events if e.rid == 0).num_cached_tokens == HIT
    for rid in (0, 1, 2):
        b.release(rid)
    assert held_pages(b) == {1: 0, 2: 0} and not b.store_import.pending


def test_a_corrupt_block_only_shortens_the_hit(cold, written: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    root = tmp_path / "kv"
    shutil.copytree(written, root)
    store = TieredStore(StoreConfig(path=str(root)))
    b = engine("normal", store=store)
    # damage the 5th ratio-1 page: pages 0-3 (64 tokens) still form a hit, cut to the 32-token grain
    victim = store.disk.path(b.store_import._keys(PROMPT)[0][4])  # type: ignore[union-attr]
    victim.write_bytes(victim.read_bytes()[:-3])
    tokens, logprobs, rows, cached = _run(b, 0, PROMPT)
    assert (tokens, logprobs) == cold and cached == 64 and rows == len(PROMPT) - (64 - REPLAY)
    assert store.metrics()["disk"]["corrupt"] == 1
