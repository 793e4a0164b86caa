"""The router's own Prometheus metrics (its own registry, so tests can run several routers)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dsgraph.runtime.router.pool import Pool
from dsgraph.runtime.router.select import Selector

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_CHUNK_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class _PoolCollector(Collector):
    """Per-engine gauges read from the pool when scraped (engines come and go)."""

    def __init__(self, pool: Pool, selector: Selector) -> None:
        self.pool, self.selector = pool, selector

    def collect(self):  # type: ignore[no-untyped-def]
        rows = {
            "healthy": ("1 when the engine is in the pool", lambda e: float(e.available)),
            "in_flight": ("requests this router has open on the engine", lambda e: float(e.in_flight)),
            "kv_tokens": ("context tokens the engine holds (polled or local estimate)", None),
            "batch": ("requests running or queued on the engine (polled or local)", None),
        }
        for key, (doc, read) in rows.items():
            g = GaugeMetricFamily(f"dsgraph_router_engine_{key}", doc, labels=["engine", "role"])
            for e in self.pool.engines:
                c = e.candidate()
                value = read(e) if read else float(c.kv_tokens if key == "kv_tokens" else c.batch)
                g.add_metric([e.url, e.role], value)
            yield g
        cost = GaugeMetricFamily(
            "dsgraph_router_prefill_cost", "fitted prefill cost t(L) = a + b*L + c*L^2", labels=["term"]
        )
        m = self.selector.cost.model
        for term, value in (("a", m.a), ("b", m.b), ("c", m.c)):
            cost.add_metric([term], value)
        yield cost


class RouterMetrics:
    def __init__(self, pool: Pool, selector: Selector) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "dsgraph_router_requests", "requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.attempts = Counter(
            "dsgraph_router_upstream_attempts",
            "requests sent to engines, by outcome",
            ["outcome"],
            registry=r,
        )
        self.retries = Counter(
            "dsgraph_router_retries",
            "requests sent again to another engine (no token had been sent)",
            registry=r,
        )
        self.stream_errors = Counter(
            "dsgraph_router_stream_errors",
            "streams that lost their engine after they began and were ended with an error event",
            registry=r,
        )
        self.buckets = Counter(
            "dsgraph_router_context_bucket",
            "requests by prefill context-length bucket",
            ["bucket"],
            registry=r,
        )
        self.ttft = Histogram(
            "dsgraph_router_upstream_first_byte_seconds",
            "from sending a request to an engine to its first response byte",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.chunk = Histogram(
            "dsgraph_router_prefill_chunk_tokens",
            "first prefill chunk the cost model chose for a request",
            buckets=_CHUNK_BUCKETS,
            registry=r,
        )
        Gauge("dsgraph_router_engines", "engines configured", registry=r).set(len(pool.engines))
        r.register(_PoolCollector(pool, selector))
