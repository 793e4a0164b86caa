"""`TieredStore`: host tier over disk tier behind one get/put interface, with write-through, asynchronous
prefetch (disk reads on a background thread, so an engine step never waits on the SSD) and per-tier
metrics. Block keys bind a page's token chain (the C++ prefix cache's chain key, `page_hash.h`) to the
model identity and the cache ratio, so blocks of another model, numerics or page size never match."""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dsgraph.runtime.kvstore.config import StoreConfig
from dsgraph.runtime.kvstore.tiers import Clock, DiskTier, HostTier


def block_key(identity: str, ratio: int, chain_key: int) -> str:
    """Content address of the page of ratio `ratio` whose whole-prefix chain key is `chain_key`."""
    raw = identity.encode() + struct.pack("<iQ", ratio, chain_key)
    return hashlib.blake2b(raw, digest_size=20).hexdigest()


class TieredStore:
    """Blocks by key: host memory first, then block files (when `config.path` is set). `put` writes
    through to both; `get` promotes a disk hit into host memory; `device_hits` counts prompt pages the
    engines served from their own device pages (the tier above this store)."""

    def __init__(self, config: StoreConfig, clock: Clock = time.time, remote: Any = None) -> None:
        """`remote`: the cross-machine tier below the disk (remote.MooncakeTier), or None."""
        self.config = config
        self.remote = remote
        self.host = HostTier(config.host_capacity_bytes, config.host_ttl_s, clock)
        self.disk = (
            DiskTier(Path(config.path) / "blocks", config.disk_capacity_bytes, config.disk_ttl_s, clock)
            if config.path
            else None
        )
        self._io = ThreadPoolExecutor(config.io_threads, thread_name_prefix="dsgraph-kvstore")
        self.device_hits = 0
        self.device_hit_bytes = 0

    def get(self, key: str) -> bytes | None:
        payload = self.host.get(key)
        if payload is not None or (self.disk is None and self.remote is None):
            return payload
        found = self.disk.get(key) if self.disk is not None else None
        if found is None and self.remote is not None:
            found = self.remote.get(key)
            if found is not None and self.disk is not None:
                self.disk.put(key, found[0], created=found[1])
        if found is None:
            return None
        self.host.put(key, found[0], created=found[1])
        return found[0]

    def contains(self, key: str) -> bool:
        """Whether a get would likely hit (no read; a disk block may still turn out corrupt)."""
        if key in self.host or (self.disk is not None and key in self.disk):
            return True
        return self.remote is not None and key in self.remote

    def put(self, key: str, payload: bytes) -> None:
        created = self.host.clock()
        self.host.put(key, payload, created)
        if self.disk is not None:
            self.disk.put(key, payload, created)
        if self.remote is not None:
            self.remote.put(key, payload, created)

    def put_async(self, items: Iterable[tuple[str, bytes]]) -> Future[None]:
        """Write-through on a background thread (the engine step that finished a prefill goes on)."""
        batch = list(items)
        return self._io.submit(lambda: [self.put(k, v) for k, v in batch] and None)

    def prefetch(self, keys: list[str]) -> Future[list[bytes | None]]:
        """Read `keys` (disk hits land in host memory) on a background thread; the future holds each
        block or None."""
        return self._io.submit(lambda: [self.get(k) for k in keys])

    def count_device_hit(self, num_bytes: int) -> None:
        self.device_hits += 1
        self.device_hit_bytes += num_bytes

    def metrics(self) -> dict[str, dict[str, int]]:
        """Per tier: hits, misses, bytes read / written, evictions, expired, corrupt, blocks and bytes
        held now (`device`: prompt pages served from the engines' own pages)."""
        out = {"device": {"hits": self.device_hits, "bytes_read": self.device_hit_bytes}}
        out["host"] = self.host.stats.snapshot()
        if self.disk is not None:
            out["disk"] = self.disk.stats.snapshot()
        if self.remote is not None:
            out["remote"] = self.remote.stats.snapshot()
        return out

    def close(self) -> None:
        self._io.shutdown(wait=True)
        if self.remote is not None:
            self.remote.close()
