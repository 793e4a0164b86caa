"""Cache managers of the C++ runtime: SlotPool, PagePool (reference counts), chain keys and PrefixCache
(longest common prefix over every ratio, idle pages in an LRU, eviction)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgraph.runtime import _native


def ids(values: list[int] | range) -> np.ndarray:
    return np.asarray(list(values), dtype=np.int32)


def test_slot_pool_hands_out_each_slot_once() -> None:
    pool = _native.SlotPool(3)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    assert pool.allocate() is None
    assert (pool.num_free, pool.num_used, pool.num_total) == (0, 3, 3)
    pool.release(1)
    pool.release(0)
    assert [pool.allocate(), pool.allocate()] == [1, 0]  # released longest ago first
    assert pool.is_used(2)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda p: p.release(1), r"SlotPool.release: slot 1 is already free"),
        (lambda p: p.release(5), r"SlotPool.release: slot 5 is outside 0..1"),
        (lambda p: p.is_used(-1), r"SlotPool.is_used: slot -1 is outside 0..1"),
    ],
)
def test_slot_pool_errors(action, message: str) -> None:  # type: ignore[no-untyped-def]
    pool = _native.SlotPool(2)
    with pytest.raises(ValueError, match=message):
        action(pool)


def test_pool_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"SlotPool: num_slots = 0 is not positive"):
        _native.SlotPool(0)
    with pytest.raises(ValueError, match=r"PagePool: num_pages = -2 is not positive"):
        _native.PagePool(-2)


def test_page_returns_to_free_list_when_its_count_reaches_zero() -> None:
    pool = _native.PagePool(2)
    page = pool.allocate()
    assert (page, pool.refcount(0)) == (0, 1)
    pool.retain(0)
    pool.retain(0)
    assert pool.refcount(0) == 3
    assert [pool.release(0), pool.release(0)] == [False, False]
    assert pool.num_free == 1
    assert pool.release(0) is True
    assert (pool.num_free, pool.refcount(0)) == (2, 0)
    with pytest.raises(ValueError, match=r"PagePool.release: page 0 is free \(reference count 0\)"):
        pool.release(0)
    with pytest.raises(ValueError, match=r"PagePool.retain: page 1 is free"):
        pool.retain(1)
    with pytest.raises(ValueError, match=r"PagePool.refcount: page 2 is outside 0..1"):
        pool.refcount(2)


@settings(max_examples=60)
@given(
    st.lists(st.tuples(st.sampled_from(["allocate", "retain", "release"]), st.integers(0, 7)), max_size=80)
)
def test_page_pool_matches_a_counting_model(ops: list[tuple[str, int]]) -> None:
    pool, counts = _native.PagePool(8), [0] * 8
    for action, page in ops:
        if action == "allocate":
            got = pool.allocate()
            if 0 in counts:
                assert got is not None and counts[got] == 0
                counts[got] = 1
            else:
                assert got is None
        elif counts[page] == 0:
            with pytest.raises(ValueError, match=f"page {page} is free"):
                getattr(pool, action)(page)
        elif action == "retain":
            pool.retain(page)
            counts[page] += 1
        else:
            counts[page] -= 1
            assert pool.release(page) is (counts[page] == 0)
        assert [pool.refcount(p) for p in range(8)] == counts
        assert pool.num_free == counts.count(0) and pool.num_free + pool.num_used == pool.num_total


def test_chain_keys_depend_on_the_whole_prefix() -> None:
    base = ids(range(10, 30))
    keys = _native.hash_chain(base, 4)
    assert keys.dtype == np.uint64 and keys.shape == (5,)
    assert len(set(keys.tolist())) == 5
    assert _native.hash_chain(base[:19], 4).tolist() == keys[:4].tolist()  # a partial page has no key
    changed = base.copy()
    changed[9] = 99  # inside page 2: pages 0-1 keep their keys, every later key changes
    other = _native.hash_chain(changed, 4)
    assert other[:2].tolist() == keys[:2].tolist()
    assert all(a != b for a, b in zip(other[2:].tolist(), keys[2:].tolist(), strict=True))
    swapped = base.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # same tokens, other order
    assert _native.hash_chain(swapped, 4)[0] != keys[0]
    assert _native.hash_chain(base, 2)[1] != keys[0]  # pages of other sizes never share keys
    with pytest.raises(ValueError, match=r"hash_chain: tokens_per_page = 0 is not positive"):
        _native.hash_chain(base, 0)


def cache_with_prompt(prompt: np.ndarray, full_pages: dict[int, int]) -> _native.PrefixCache:
    """Page size 2, ratios 1 and 2; the first `full_pages[r]` pages of the prompt cached for ratio r."""
    cache = _native.PrefixCache(2, [1, 2], [8, 8])
    for ratio, count in full_pages.items():
        for index in range(count):
            page = cache.allocate(ratio)
            assert cache.insert(prompt, ratio, index, page)
            cache.release(ratio, page)  # no user left: the page stays cached and idle
    return cache


def test_hit_is_the_prefix_cached_for_every_ratio_in_whole_grains() -> None:
    prompt = ids(range(3, 19))  # 16 tokens: 8 ratio-1 pages of 2 tokens, 4 ratio-2 pages of 4
    cache = cache_with_prompt(prompt, {1: 3, 2: 1})
    assert cache.grain == 4
    assert cache.match(prompt) == 4  # ratio 1 covers 6 tokens, ratio 2 covers 4
    cache = cache_with_prompt(prompt, {1: 3, 2: 2})
    assert cache.match(prompt) == 4  # 6 and 8 tokens: 6, cut to a multiple of the grain
    cache = cache_with_prompt(prompt, {1: 4, 2: 2})
    assert cache.match(prompt) == 8
    assert cache.match(ids([3, 4, 5, 6, 99, 8, 9, 10])) == 4  # differs in the second grain
    assert cache.match(ids([4, 3, 5, 6])) == 0
    pages = cache.acquire(prompt, 8)
    assert [len(p) for p in pages] == [4, 2]
    assert all(cache.refcount(r, p) == 2 for r, ps in zip((1, 2), pages, strict=True) for p in ps)
    assert cache.num_idle(1) == 0 and cache.num_idle(2) == 0
    with pytest.raises(ValueError, match=r"PrefixCache.acquire: hit = 12 is not a cached prefix"):
        cache.acquire(prompt, 12)


def test_idle_pages_are_evicted_least_recently_released_first() -> None:
    prompt = ids(range(3, 11))  # 4 ratio-1 pages
    cache = _native.PrefixCache(2, [1], [4])
    pages = [cache.allocate(1) for _ in range(4)]
    for index, page in enumerate(pages):
        assert cache.insert(prompt, 1, index, page)
    assert cache.refcount(1, pages[0]) == 2  # the user's reference and the cache's own
    for page in reversed(pages):  # tail of the chain released first: evicted first
        cache.release(1, page)
    assert (cache.num_free(1), cache.num_idle(1), cache.num_available(1)) == (0, 4, 4)
    assert cache.allocate(1) == pages[3]
    assert not cache.is_cached(1, pages[3]) and cache.num_cached(1) == 3
    assert cache.match(prompt) == 6
    assert cache.acquire(prompt, 2) == [[pages[0]]]  # in use again: no longer evictable
    assert cache.allocate(1) == pages[2]
    assert cache.allocate(1) == pages[1]
    assert cache.allocate(1) is None  # pages[0] has a user
    assert cache.match(prompt) == 2 and cache.cached_pages(1) == [pages[0]]
    cache.release(1, pages[0])
    assert cache.num_idle(1) == 1 and cache.refcount(1, pages[0]) == 1


def test_insert_keeps_the_first_page_of_a_prefix() -> None:
    prompt = ids(range(3, 7))
    cache = _native.PrefixCache(2, [1], [4])
    a, b = cache.allocate(1), cache.allocate(1)
    assert cache.insert(prompt, 1, 0, a)
    assert not cache.insert(prompt, 1, 0, b)  # same prefix computed twice: b stays private
    assert not cache.insert(prompt, 1, 1, a)  # a page holds one prefix
    assert cache.cached_pages(1) == [a]
    cache.release(1, b)
    assert cache.num_free(1) == 3
    with pytest.raises(ValueError, match=r"PrefixCache.insert: page 1 of ratio 1 is free"):
        cache.insert(prompt, 1, 1, b)
    with pytest.raises(ValueError, match=r"index 2 is not a full page of the prompt \(it has 2"):
        cache.insert(prompt, 1, 2, a)
    with pytest.raises(ValueError, match=r"ratio 4 is not one of \[1\]"):
        cache.allocate(4)


def test_lookup_counters() -> None:
    cache = _native.PrefixCache(4, [1, 2], [4, 4])
    cache.count_lookup(20, 8)
    cache.count_lookup(9, 0)
    assert (cache.lookup_tokens, cache.hit_tokens) == (29, 8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, [1], [4]), r"page_size = 0 is not positive"),
        ((4, [], []), r"ratios is empty"),
        ((4, [1, 2], [4]), r"num_pages has 1 entries; expected one per ratio \(2\)"),
        ((4, [2, 1], [4, 4]), r"ratios\[1\] = 1; expected positive, strictly increasing"),
        ((4, [1], [0]), r"PagePool: num_pages = 0 is not positive"),
    ],
)
def test_prefix_cache_layout_errors(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _native.PrefixCache(*args)
