"""Store hits into an engine's own prefix cache: a prompt whose prefix blocks another engine computed (the
shared KV store's host or disk tier) and this engine's device pages lack skips that prefill.

On `start` the engine asks which leading pages of the prompt the store holds beyond its own cached ones.
If they would lengthen the prefix hit, the request waits (it is not in the scheduler yet) while a store
thread reads the blocks into host memory (`TieredStore.prefetch`: disk reads land in the host tier, the
staging area); every engine step meanwhile runs without it, so no step waits on the SSD. `poll`, at the
start of each step, takes the requests whose reads are done, in arrival order: the scheduler adopts fresh
pages under the blocks' chain keys (`import_prefix`), the bytes are written into them, and the request
is queued. Its admission is then an ordinary prefix hit (with the SWA replay of `prefix_replay`), so its
tokens equal a cold engine's.

`write_through` is the other half: when a request's first token is sampled on an engine with a store,
the full prompt pages its prefix cache holds and the store lacks are written on the store's threads.
A block that turns out missing or corrupt at read time only shortens the hit."""

from __future__ import annotations

import concurrent.futures as cf
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dsgraph.runtime.kvstore.handoff import prompt_block_keys

if TYPE_CHECKING:
    from dsgraph.runtime.engine import Engine
    from dsgraph.runtime.kvstore.layout import CacheLayout
    from dsgraph.runtime.kvstore.store import TieredStore

_IDLE_WAIT_S = 0.005  # how long an otherwise idle engine waits for a read before stepping again


@dataclass
class ImportStats:
    """What the import did (tests and /metrics read it)."""

    requests: int = 0  # requests that waited for a store read
    pages: int = 0  # pages adopted from store blocks
    tokens: int = 0  # prompt tokens those requests found cached after the import
    written: int = 0  # blocks written through


@dataclass
class _Pending:
    prompt: np.ndarray
    keys: list[list[str]]  # per ratio: keys of the pages [have, want) read from the store
    have: list[int]  # per ratio: pages the engine's cache held at the start
    read: cf.Future[list[bytes | None]]
    admit: Callable[[], None]


class StoreImport:
    """One engine's store import and write-through (the engine thread calls every method)."""

    def __init__(self, engine: Engine, store: TieredStore, layout: CacheLayout, identity: str) -> None:
        self.engine, self.store, self.layout, self.identity = engine, store, layout, identity
        geo = engine.model.geo
        self.page_size = geo.page_size
        self.tokens_per_page = [geo.page_size * r for r in layout.ratios]
        self.grain = math.lcm(*self.tokens_per_page)
        self.pending: dict[int, _Pending] = {}
        self.stats = ImportStats()
        self._writes: list[cf.Future[None]] = []

    def _keys(self, prompt: list[int]) -> list[list[str]]:
        return [prompt_block_keys(self.identity, prompt, r, self.page_size) for r in self.layout.ratios]

    def start(self, rid: int, prompt: list[int], admit: Callable[[], None]) -> bool:
        """True when `rid` waits for store blocks (`admit` queues it once they are in); False: queue it
        now (the store adds nothing to what the engine's cache holds)."""
        tokens = np.ascontiguousarray(prompt, dtype=np.int32)
        have = [len(p) for p in self.engine.scheduler.native.prefix_pages(tokens)]
        keys = self._keys(prompt)
        want = [h + self._stored_run(k[h:]) for h, k in zip(have, keys, strict=True)]
        if self._joint(want) <= self._joint(have):
            return False
        wanted = [k[h:w] for k, h, w in zip(keys, have, want, strict=True)]
        read = self.store.prefetch([key for ks in wanted for key in ks])
        self.pending[rid] = _Pending(tokens, wanted, have, read, admit)
        self.stats.requests += 1
        return True

    def _stored_run(self, keys: list[str]) -> int:
        n = 0
        while n < len(keys) and self.store.contains(keys[n]):
            n += 1
        return n

    def _joint(self, pages: list[int]) -> int:
        """Prefix-hit tokens these per-ratio page counts give (every ratio, cut to the grain)."""
        hit = min(n * t for n, t in zip(pages, self.tokens_per_page, strict=True))
        return hit - hit % self.grain

    def poll(self, idle: bool) -> list[tuple[int, str]]:
        """Queue the waiting requests whose blocks are read, in arrival order (a later one whose read
        finished first goes first: nothing waits on another's SSD read); returns (rid, error) of those
        the scheduler refused. `idle`: nothing else can run, so wait a little for a read."""
        if not self.pending:
            return []
        if idle:
            cf.wait([p.read for p in self.pending.values()], _IDLE_WAIT_S, cf.FIRST_COMPLETED)
        failed = []
        for rid, p in list(self.pending.items()):
            if p.read.done():
                del self.pending[rid]
                self._install(p)
                try:
                    p.admit()
                except ValueError as exc:  # the scheduler's checks (e.g. more pages than the pool has)
                    failed.append((rid, str(exc)))
        return failed

    def cancel(self, rid: int) -> bool:
        """Forget a waiting request (aborted before its blocks arrived); False when none waits."""
        return self.pending.pop(rid, None) is not None

    def _install(self, p: _Pending) -> None:
        """Adopt the blocks read into the prefix cache (what arrived in order, from what the cache holds
        now: pages evicted since the start are not re-read, they only shorten the hit)."""
        try:
            blocks = p.read.result()
        except Exception:  # an unreadable store is a miss: the request prefills everything
            return
        native = self.engine.scheduler.native
        now = [len(x) for x in native.prefix_pages(p.prompt)]
        data: list[list[bytes]] = []
        at = 0
        for keys in p.keys:
            got = blocks[at : at + len(keys)]
            at += len(keys)
            run = next((i for i, b in enumerate(got) if b is None), len(got))
            data.append([b for b in got[:run] if b is not None])
        counts = [h + len(d) if n >= h else n for n, h, d in zip(now, p.have, data, strict=True)]
        joint = self._joint(counts)
        counts = [max(n, joint // t) for n, t in zip(now, self.tokens_per_page, strict=True)]
        pages = native.import_prefix(p.prompt, counts)
        caches = self.engine.session.caches
        for r, held, h, d in zip(self.layout.ratios, pages, p.have, data, strict=True):
            for j, page in enumerate(held):
                if page >= 0:  # a fresh page: page j of the chain, read as d[j - h]
                    self.layout.write_page(caches, r, page, d[j - h])
                    self.stats.pages += 1
        self.stats.tokens += self._joint([len(x) for x in native.prefix_pages(p.prompt)])

    def write_through(self, prompt: list[int]) -> None:
        """Write the prompt's cached full pages the store lacks (after its first token is sampled)."""
        tokens = np.ascontiguousarray(prompt, dtype=np.int32)
        pages = self.engine.scheduler.native.prefix_pages(tokens)
        caches, items = self.engine.session.caches, []
        for r, keys, held in zip(self.layout.ratios, self._keys(prompt), pages, strict=True):
            for key, page in zip(keys, held, strict=False):
                if not self.store.contains(key):
                    items.append((key, self.layout.page_bytes(caches, r, page)))
        if items:
            self._writes = [w for w in self._writes if not w.done()] + [self.store.put_async(items)]
            self.stats.written += len(items)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every block written through so far is in the store (tests; a clean shutdown)."""
        for w in self._writes:
            w.result(timeout_s)
        self._writes.clear()


def store_import_for(engine: Engine, store: TieredStore | None) -> StoreImport | None:
    """The import of a NORMAL or PROMPT engine with a store and its prefix cache on (a COMPLETION engine
    prefills nothing; a PROMPT engine's export writes its pages through already)."""
    from dsgraph.runtime.kvstore.pd_engines import pd_state

    if (
        store is None
        or engine.config.engine_type == "completion"
        or not engine.config.cache.enable_prefix_cache
    ):
        return None
    pd = engine.pd if engine.pd is not None else pd_state(engine, store)
    return StoreImport(engine, store, pd.layout, pd.identity)
