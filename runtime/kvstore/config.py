"""The store's one typed config, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Tiers below the engine's own device pages (its prefix cache): a host-memory pool, then block files
    under `path` (None: no disk tier, nothing survives the process). Capacities are bytes of payload;
    each tier evicts its least recently used blocks past capacity and drops blocks older than its TTL
    (counted from when the block was first written). The disk TTL default is DeepSeek's for agent
    traffic (3 days); host memory is a short-lived staging pool."""

    path: str | None = None
    host_capacity_bytes: int = 4 * GIB
    disk_capacity_bytes: int = 256 * GIB
    host_ttl_s: float = 3600.0
    disk_ttl_s: float = 3 * DAY_S
    handoff_ttl_s: float = 120.0  # a prefilled request not picked up by then is dropped
    io_threads: int = 2  # background readers (prefetch) and writers (write-through)

    def __post_init__(self) -> None:
        for name in ("host_capacity_bytes", "disk_capacity_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"StoreConfig.{name} = {value!r}; expected an integer >= 0")
        for name in ("host_ttl_s", "disk_ttl_s", "handoff_ttl_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"StoreConfig.{name} = {value!r}; expected a number of seconds > 0")
        if not isinstance(self.io_threads, int) or not 1 <= self.io_threads <= 64:
            raise ValueError(f"StoreConfig.io_threads = {self.io_threads!r}; expected 1..64")
