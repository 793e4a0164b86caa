"""/metrics series of prefill/decode disaggregation and the KV store, read when scraped: per store tier
hits, misses, bytes read and written, evictions, expired and corrupt blocks, blocks and bytes held; and
per engine the handoffs made, admitted and failed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_COUNTERS = ("hits", "misses", "bytes_read", "bytes_written", "evictions", "expired", "corrupt")
_GAUGES = ("blocks", "bytes")


class StoreCollector:
    def __init__(self, store: Any) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        tiers = self.store.metrics()
        for name in (*_COUNTERS, *_GAUGES):
            kind = CounterMetricFamily if name in _COUNTERS else GaugeMetricFamily
            family = kind(
                f"dsgraph_kvstore_{name}", f"KV store {name.replace('_', ' ')} per tier", labels=["tier"]
            )
            for tier, values in tiers.items():
                if name in values:
                    family.add_metric([tier], values[name])
            yield family


class HandoffCollector:
    """`counts()` -> {result: count} of this engine's handoffs (exported, admitted, failed stages)."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "dsgraph_pd_handoffs", "prefill/decode handoffs by result", labels=["result"]
        )
        for result, n in self.counts().items():
            family.add_metric([result], n)
        yield family


def register_pd_metrics(registry: Any, store: Any, counts: Callable[[], dict[str, int]] | None) -> None:
    if store is not None:
        registry.register(StoreCollector(store))
    if counts is not None:
        registry.register(HandoffCollector(counts))
