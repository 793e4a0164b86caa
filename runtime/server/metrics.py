"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from dsgraph.runtime.server.engine_loop import EngineLoop


class Metrics:
    def __init__(self, loop: EngineLoop) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dsgraph_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "dsgraph_prompt_tokens", "prompt tokens of accepted requests", registry=r
        )
        self.generated_tokens = Counter("dsgraph_generation_tokens", "tokens generated", registry=r)
        self._gauge("dsgraph_num_requests_running", "requests in the engine", lambda: loop.num_running)
        self._gauge(
            "dsgraph_num_requests_waiting", "requests queued for the engine thread", lambda: loop.num_waiting
        )
        self._gauge(
            "dsgraph_prefix_cache_hit_rate",
            "prompt tokens served from the prefix cache / looked up",
            lambda: _hit_rate(loop),
        )

    def _gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        Gauge(name, doc, registry=self.registry).set_function(read)


def _hit_rate(loop: EngineLoop) -> float:
    looked, hit = loop.engine.prefix_cache_stats()
    return hit / looked if looked else 0.0
