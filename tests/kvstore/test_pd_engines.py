"""PROMPT + COMPLETION engines in one process: the pair gives a NORMAL engine's tokens (greedy, seeded;
with the pages inline or through a shared store), a prefix prefilled by one engine is a store hit for
another (also after a restart: the SSD tier), and a handoff that cannot be admitted holds nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dsgraph.runtime.kvstore.config import StoreConfig
from dsgraph.runtime.kvstore.handoff import HandoffError
from dsgraph.runtime.kvstore.pd_engines import fetch_pages
from dsgraph.runtime.kvstore.store import TieredStore
from dsgraph.runtime.sampling_params import SamplingParams
from tests.e2e.serve_util import held_pages
from tests.kvstore.pd_util import engine, normal_tokens, pair_tokens, run_all

# 45 tokens: ratio-1 pages (16 tokens) 2 full + 1 partial, ratio-2 pages (32 tokens) 1 full + 1 partial
LONG = [(7 * i + 3) % 200 + 5 for i in range(45)]
SHORT = [11, 12, 13]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def normal():  # type: ignore[no-untyped-def]
    return engine("normal")


@pytest.fixture(scope="module")
def inline():  # type: ignore[no-untyped-def]
    return engine("prompt"), engine("completion")


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_pair_inline_matches_normal(normal, inline, params: SamplingParams) -> None:  # type: ignore[no-untyped-def]
    p, c = inline
    for prompt in (LONG, SHORT):
        want = normal_tokens(normal, prompt, params)
        assert len(want) == params.max_tokens
        assert pair_tokens(p, c, prompt, params) == want
    assert held_pages(p) == {1: 0, 2: 0} and held_pages(c) == {1: 0, 2: 0}
    assert c.scheduler.native.num_free_slots == 4 and p.scheduler.native.num_handoff == 0


def test_store_hit_across_engines_and_after_restart(normal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A writes the full prompt pages to the shared directory; B (its own store object on the same
    directory, as another process would have) reads them from disk; after a restart of B's side (a new
    store and engine) the same handoff is admitted from the SSD tier again."""
    cfg = StoreConfig(path=str(tmp_path))
    store_a = TieredStore(cfg)
    p, c = engine("prompt", store=store_a), engine("completion", store=TieredStore(cfg))
    want = normal_tokens(normal, LONG, SEEDED)
    assert pair_tokens(p, c, LONG, SEEDED) == want
    disk = c.pd.store.metrics()["disk"]
    assert disk["hits"] == 3 and disk["bytes_read"] > 0  # 2 ratio-1 pages + 1 ratio-2 page
    assert store_a.metrics()["host"]["blocks"] == 3
    # the handoff names only keys for the full pages; B restarts and admits it from the files alone
    p.add_request(5, LONG, SEEDED)
    (first,) = run_all(p)
    first.handoff.wait_written()
    h = first.handoff.handoff
    assert [len(k) for _, k in sorted(h.keys.items())] == [2, 1]
    c2 = engine("completion", store=TieredStore(cfg))
    c2.add_prefilled(5, h, fetch_pages(c2, h), SEEDED)
    got = [first.token] + [e.token for e in run_all(c2) if e.token >= 0]
    assert got == want and c2.pd.store.metrics()["disk"]["hits"] == 3


def test_missing_or_mismatched_pages_hold_nothing(tmp_path: Path) -> None:
    cfg = StoreConfig(path=str(tmp_path))
    p, c = engine("prompt", store=TieredStore(cfg)), engine("completion", store=TieredStore(cfg))
    p.add_request(0, LONG, GREEDY)
    (first,) = run_all(p)
    first.handoff.wait_written()
    h = first.handoff.handoff
    # a corrupted block file is a miss: the handoff cannot be completed
    victim = c.pd.store.disk.path(h.keys[1][1])
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    with pytest.raises(HandoffError, match="ratio 1 pages \\[1\\]"):
        fetch_pages(c, h)
    # pages of the wrong count or size: refused after the reservation, which is freed
    inline = engine("prompt")
    inline.add_request(0, LONG, GREEDY)
    (ev,) = run_all(inline)
    hi = ev.handoff.handoff
    good = fetch_pages(c, hi)
    for bad in ({**good, 1: good[1][:-1]}, {**good, 2: [good[2][0][:-1], *good[2][1:]]}):
        with pytest.raises((HandoffError, ValueError), match="ratio|bytes"):
            c.add_prefilled(1, hi, bad, GREEDY)
        run_all(c)
        assert held_pages(c) == {1: 0, 2: 0} and c.scheduler.native.num_free_slots == 4
    with pytest.raises(HandoffError, match="another model"):
        c.add_prefilled(2, dataclasses.replace(hi, identity="x" * 32), good, GREEDY)


def test_a_request_ending_at_its_first_token_stays_on_the_prompt_engine(normal, inline) -> None:  # type: ignore[no-untyped-def]
    """max_tokens 1 or a stop string in the first token's text: finished there, nothing handed off or
    held; structured outputs are refused before anything is reserved."""
    p, c = inline
    one = SamplingParams(temperature=0.0, max_tokens=1)
    want = normal_tokens(normal, LONG, one)
    p.add_request(0, LONG, one)
    (ev,) = run_all(p)
    p.release(0)
    assert [ev.token] == want and ev.finish_reason == "length" and ev.handoff is None
    text = normal.tokenizer.decode(normal_tokens(normal, LONG, GREEDY)[:1]).strip()
    stop = dataclasses.replace(GREEDY, stop=(text,))
    p.add_request(1, LONG, stop)
    (ev,) = run_all(p)
    p.release(1)
    assert ev.finish_reason == "stop" and ev.handoff is None and text not in ev.text
    assert held_pages(p) == {1: 0, 2: 0} and p.scheduler.native.num_handoff == 0
    p.add_request(2, LONG, GREEDY)
    (ev,) = run_all(p)
    p.release(2)
    h = ev.handoff.handoff
    from dsgraph.runtime.sampling_params import RequestError
    from dsgraph.runtime.structured.params import StructuredOutputsParams

    structured = dataclasses.replace(GREEDY, structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(RequestError, match="structured_outputs"):
        c.add_prefilled(3, h, fetch_pages(c, h), structured)
    assert held_pages(c) == {1: 0, 2: 0}
