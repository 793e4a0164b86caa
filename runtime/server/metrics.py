"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dsgraph.runtime.server.engine_loop import EngineLoop

# Seconds; wide enough for a CPU tiny model (milliseconds) and a loaded GPU server (seconds).
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
        self.time_to_first_token = Histogram(
            "dsgraph_time_to_first_token_seconds",
            "from receiving a request to its first generated token",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "dsgraph_inter_token_latency_seconds",
            "between consecutive generated tokens of one request, as the server hands them out",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self._gauge("dsgraph_num_requests_running", "requests in the engine", lambda: loop.num_running)
        self._gauge(
            "dsgraph_num_requests_waiting", "requests queued for the engine thread", lambda: loop.num_waiting
        )
        self._gauge(
            "dsgraph_prefix_cache_hit_rate",
            "prompt tokens served from the prefix cache / looked up",
            lambda: _hit_rate(loop),
        )
        self._gauge(
            "dsgraph_kv_cache_usage",
            "fraction of KV cache pages (all ratios) held by requests; idle prefix-cache pages count as free",
            lambda: loop.usage.pages_in_use,
        )
        self._gauge(
            "dsgraph_state_slots_used",
            "state slots (SWA ring, compressor state) in use",
            lambda: loop.usage.slots_in_use,
        )
        self._gauge("dsgraph_state_slots_total", "state slots of the engine", lambda: loop.usage.num_slots)
        eplb = getattr(loop.engine, "eplb_stats", None)  # an expert-parallel group (runtime/distributed)
        if eplb is not None:
            self._gauge(
                "dsgraph_eplb_imbalance",
                "expert load: the slowest rank's tokens over the mean rank's, over the EPLB window",
                lambda: eplb().get("imbalance", 1.0),
            )

    def _gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        Gauge(name, doc, registry=self.registry).set_function(read)


def _hit_rate(loop: EngineLoop) -> float:
    usage = loop.usage
    return usage.prefix_hit_tokens / usage.prefix_lookup_tokens if usage.prefix_lookup_tokens else 0.0
