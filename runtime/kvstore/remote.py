"""The cross-machine tier: Mooncake's distributed store (`mooncake.store.MooncakeDistributedStore`, in the
same PyPI wheels as its transfer engine) behind the tiers' get/put interface. Every engine process
mounts a segment of its host memory into one store pool run by a `mooncake_master` service; a block
put by any machine is readable by all. Blocks travel as checksummed objects (blockfile.encode), so a
damaged one is a miss and the TTL counts from the first write, as in the local tiers.

It needs the Mooncake wheel to import (on a CPU machine `mooncake-transfer-engine-non-cuda`, which also
needs libibverbs.so.1 even for TCP) and a reachable master (`mooncake_master --port P`, shipped in the
wheel); `remote_available` checks the first."""

from __future__ import annotations

import threading
import time
from typing import Any

from dsgraph.runtime.kvstore import blockfile
from dsgraph.runtime.kvstore.tiers import Clock, TierStats


def remote_available() -> bool:
    try:
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


class MooncakeTier:
    """Blocks in a Mooncake store pool: `master` is the master's host:port, `host` this process's address
    as peers reach it, `segment_bytes` the host memory it lends to the pool."""

    def __init__(
        self,
        master: str,
        host: str = "127.0.0.1",
        segment_bytes: int = 1 << 30,
        buffer_bytes: int = 64 << 20,
        ttl_s: float = 3 * 86400.0,
        clock: Clock = time.time,
    ) -> None:
        if not remote_available():
            raise RuntimeError(
                "kv store remote tier: mooncake.store does not import (pip install "
                "mooncake-transfer-engine-non-cuda on a CPU machine; it needs libibverbs.so.1)"
            )
        from mooncake.store import MooncakeDistributedStore

        self.master, self.ttl_s, self.clock = master, ttl_s, clock
        self.store: Any = MooncakeDistributedStore()
        rc = self.store.setup(host, "P2PHANDSHAKE", segment_bytes, buffer_bytes, "tcp", "", master)
        if rc != 0:
            raise RuntimeError(
                f"kv store remote tier: cannot join the Mooncake master at {master} (status {rc})"
            )
        self._lock = threading.Lock()
        self.stats = TierStats()

    def __contains__(self, key: str) -> bool:
        return bool(self.store.is_exist(key) == 1)

    def get(self, key: str) -> tuple[bytes, float] | None:
        """(payload, creation time), or None for a missing, damaged or expired block."""
        data = bytes(self.store.get(key))
        why = None
        try:
            payload, created = blockfile.decode(data, f"mooncake block {key}") if data else (b"", 0.0)
        except blockfile.CorruptBlock:
            payload, created, why = b"", 0.0, "corrupt"
        if not data or why is not None or self.clock() - created > self.ttl_s:
            with self._lock:
                self.stats.misses += 1
                if data:
                    setattr(self.stats, why or "expired", getattr(self.stats, why or "expired") + 1)
            if data:
                self.store.remove(key)
            return None
        with self._lock:
            self.stats.hits += 1
            self.stats.bytes_read += len(payload)
        return payload, created

    def put(self, key: str, payload: bytes, created: float | None = None) -> None:
        if key in self:
            return  # content-addressed: the pool holds these bytes already
        when = self.clock() if created is None else created
        if self.store.put(key, blockfile.encode(payload, when)) == 0:
            with self._lock:
                self.stats.bytes_written += len(payload)

    def close(self) -> None:
        self.store.close()
