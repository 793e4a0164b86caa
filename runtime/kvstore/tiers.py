"""The two tiers under the device pages: `HostTier` (a byte-bounded LRU in process memory) and
`DiskTier` (one checksummed block file per key under a directory, shared by every engine of the machine:
files are written atomically, the directory is the index, so it survives restarts). Both drop blocks past
their TTL and count hits, misses, bytes and evictions in `TierStats`."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from dsgraph.runtime.kvstore import blockfile

Clock = Callable[[], float]


@dataclass
class TierStats:
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    evictions: int = 0  # blocks removed to make room
    expired: int = 0  # blocks removed past their TTL
    corrupt: int = 0  # block files that failed their checks (treated as misses and removed)
    blocks: int = 0  # held now
    bytes: int = 0  # payload bytes held now

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


class HostTier:
    """Least recently used blocks in memory, at most `capacity` payload bytes, each kept `ttl_s`."""

    def __init__(self, capacity: int, ttl_s: float, clock: Clock = time.time) -> None:
        self.capacity, self.ttl_s, self.clock = capacity, ttl_s, clock
        self._blocks: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = TierStats()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            entry = self._blocks.get(key)
            if entry is not None and self.clock() - entry[1] > self.ttl_s:
                self._drop(key)
                self.stats.expired += 1
                entry = None
            if entry is None:
                self.stats.misses += 1
                return None
            self._blocks.move_to_end(key)
            self.stats.hits += 1
            self.stats.bytes_read += len(entry[0])
            return entry[0]

    def put(self, key: str, payload: bytes, created: float | None = None) -> None:
        """Keep `payload` (created: its first write time, for the TTL); a block larger than the whole
        tier is not kept."""
        if len(payload) > self.capacity:
            return
        with self._lock:
            if key in self._blocks:
                self._blocks.move_to_end(key)
                return
            while self.stats.bytes + len(payload) > self.capacity:
                self._drop(next(iter(self._blocks)))
                self.stats.evictions += 1
            self._blocks[key] = (payload, self.clock() if created is None else created)
            self.stats.blocks += 1
            self.stats.bytes += len(payload)
            self.stats.bytes_written += len(payload)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            entry = self._blocks.get(key)
            return entry is not None and self.clock() - entry[1] <= self.ttl_s

    def _drop(self, key: str) -> None:
        payload, _ = self._blocks.pop(key)
        self.stats.blocks -= 1
        self.stats.bytes -= len(payload)


class DiskTier:
    """Block files `<root>/<key[:2]>/<key>.blk`. A file's mtime is its last use (refreshed on every hit,
    so the LRU order is shared by every process using the directory); its header holds its creation time
    for the TTL. Another process may add or remove files at any time: a missing file is a miss."""

    SUFFIX = ".blk"

    def __init__(self, root: Path, capacity: int, ttl_s: float, clock: Clock = time.time) -> None:
        self.root, self.capacity, self.ttl_s, self.clock = Path(root), capacity, ttl_s, clock
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.stats = TierStats()
        self._sizes: dict[str, int] = {}
        self.rescan()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{self.SUFFIX}"

    def rescan(self) -> None:
        """Rebuild the index from the directory (at open, and before evicting: other engines write
        too); expired and unreadable files are removed."""
        sizes: dict[str, int] = {}
        now = self.clock()
        for path in self.root.glob(f"*/*{self.SUFFIX}"):
            try:
                expired = now - blockfile.read_created(path) > self.ttl_s
                size = path.stat().st_size - blockfile.HEADER_BYTES
            except (OSError, blockfile.CorruptBlock):
                expired, size = True, 0
            if expired:
                path.unlink(missing_ok=True)
                self.stats.expired += 1
            else:
                sizes[path.stem] = size
        with self._lock:
            self._sizes = sizes
            self._recount()

    def _recount(self) -> None:
        self.stats.blocks, self.stats.bytes = len(self._sizes), sum(self._sizes.values())

    def _index_set(self, key: str, size: int) -> None:
        """Index one block, the totals kept as running sums (a recount per write made puts quadratic)."""
        self._index_drop(key)
        self._sizes[key] = size
        self.stats.blocks, self.stats.bytes = self.stats.blocks + 1, self.stats.bytes + size

    def _index_drop(self, key: str) -> None:
        size = self._sizes.pop(key, None)
        if size is not None:
            self.stats.blocks, self.stats.bytes = self.stats.blocks - 1, self.stats.bytes - size

    def __contains__(self, key: str) -> bool:
        return self.path(key).exists()

    def get(self, key: str) -> tuple[bytes, float] | None:
        """(payload, creation time), or None for a missing, expired or corrupt block (the last two are
        removed)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
            payload, created = blockfile.decode(data, str(path))
        except FileNotFoundError:
            return self._miss(key, None)
        except (OSError, blockfile.CorruptBlock):
            return self._miss(key, "corrupt")
        if self.clock() - created > self.ttl_s:
            return self._miss(key, "expired")
        now = self.clock()
        os.utime(path, (now, now))
        with self._lock:
            self.stats.hits += 1
            self.stats.bytes_read += len(payload)
        return payload, created

    def _miss(self, key: str, why: str | None) -> None:
        with self._lock:
            self.stats.misses += 1
            if why is not None:
                setattr(self.stats, why, getattr(self.stats, why) + 1)
                self.path(key).unlink(missing_ok=True)
                self._index_drop(key)
        return None

    def put(self, key: str, payload: bytes, created: float | None = None) -> None:
        if len(payload) > self.capacity or key in self:
            return  # content-addressed: an existing file already holds these bytes
        when = self.clock() if created is None else created
        blockfile.write_atomic(self.path(key), blockfile.encode(payload, when))
        now = self.clock()
        os.utime(self.path(key), (now, now))  # last use on the store's clock, like a hit
        with self._lock:
            self._index_set(key, len(payload))
            self.stats.bytes_written += len(payload)
            over = self.stats.bytes > self.capacity
        if over:
            self._evict(keep=key)

    def _evict(self, keep: str) -> None:
        """Remove the least recently used files until the directory fits its capacity."""
        self.rescan()
        by_use = []
        for k in self._sizes:
            try:
                by_use.append((self.path(k).stat().st_mtime, k))
            except FileNotFoundError:
                continue
        by_use.sort()
        with self._lock:
            for _, k in by_use:
                if self.stats.bytes <= self.capacity:
                    break
                if k == keep:
                    continue
                self.path(k).unlink(missing_ok=True)
                self._index_drop(k)
                self.stats.evictions += 1
