"""RouterConfig: every option of `dsgraph router`, validated in one place (errors name the field)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlparse

POLICIES = ("balanced", "round_robin", "least_requests", "random")
# DeepSeek's prefill buckets: < 16K, 16-64K, 64-256K, >= 256K tokens of context
CONTEXT_BUCKETS = (16 * 1024, 64 * 1024, 256 * 1024)


@dataclass(frozen=True)
class RouterConfig:
    normal: tuple[str, ...] = ()  # engines that prefill and decode (`dsgraph serve`)
    prefill: tuple[str, ...] = ()  # prompt engines (`--engine-type prompt`)
    decode: tuple[str, ...] = ()  # completion engines (`--engine-type completion`)
    policy: str = "balanced"
    poll_interval_s: float = 1.0  # GET /load of every engine
    poll_timeout_s: float = 2.0
    fail_after: int = 2  # consecutive failed polls before an engine leaves the pool
    rejoin_after: int = 2  # consecutive good polls before it comes back
    request_timeout_s: float = 600.0  # one upstream request, first byte to last
    connect_timeout_s: float = 5.0
    max_attempts: int = 3  # engines one request may be sent to before it fails (only before a token)
    chars_per_token: float = 4.0  # prompt length estimate from the request's text (no tokenizer here)
    kv_per_seq: float = 4096.0  # decode: KV tokens whose attention costs as much as one more sequence
    prefill_budget_s: float = 0.25  # time one prefill chunk may take (the chunk size fills it)
    min_chunk_tokens: int = 256
    prefix_affinity: bool = False  # prefer the engine a prompt prefix hashes to, while loads are close
    affinity_prefix_chars: int = 1024
    affinity_slack: float = 0.25  # allowed relative excess of the preferred engine's load
    context_buckets: tuple[int, ...] = CONTEXT_BUCKETS
    api_key: str | None = None  # clients must send it; it is also sent on to the engines
    seed: int = 0  # of the `random` policy

    def __post_init__(self) -> None:
        if not (self.normal or self.prefill or self.decode):
            raise ValueError("engines: give at least one --normal URL, or --prefill and --decode URLs")
        if bool(self.prefill) != bool(self.decode):
            raise ValueError("prefill/decode: a prompt engine needs a completion engine and vice versa")
        for name in ("normal", "prefill", "decode"):
            for url in getattr(self, name):
                _check_url(name, url)
        if self.policy not in POLICIES:
            raise ValueError(f"policy: {self.policy!r}, expected one of {', '.join(POLICIES)}")
        for name in ("poll_interval_s", "poll_timeout_s", "request_timeout_s", "connect_timeout_s"):
            _positive(name, getattr(self, name))
        _positive("chars_per_token", self.chars_per_token)
        _positive("prefill_budget_s", self.prefill_budget_s)
        _positive("kv_per_seq", self.kv_per_seq)
        for name in ("fail_after", "rejoin_after", "max_attempts", "min_chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)}, expected >= 1")
        if not (0 <= self.affinity_slack <= 10):
            raise ValueError(f"affinity_slack: {self.affinity_slack}, expected in [0, 10]")
        if list(self.context_buckets) != sorted(set(self.context_buckets)):
            raise ValueError(f"context_buckets: {self.context_buckets}, expected strictly increasing")

    @property
    def urls(self) -> tuple[str, ...]:
        return self.normal + self.prefill + self.decode


def _check_url(name: str, url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{name}: {url!r} is not an http(s)://host:port URL")


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: {value}, expected a positive number")
