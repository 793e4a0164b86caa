"""The engines behind a router: each one's health and load, polled from its GET /load (or, from an
engine without it, /health and /metrics), plus what the router itself has sent it and not yet seen
finish (the polled figures lag by up to one poll interval; the local ones do not)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx

from dsgraph.runtime.router.config import RouterConfig
from dsgraph.runtime.router.policy import Candidate

ROLES = ("normal", "prefill", "decode")


@dataclass
class EngineState:
    url: str
    role: str
    healthy: bool = False  # set by the first good poll; cleared by fail_after bad ones or a failed request
    ever_healthy: bool = False  # a new engine joins on its first good poll, a failed one after rejoin_after
    draining: bool = False
    good: int = 0  # consecutive good polls
    bad: int = 0  # consecutive bad polls
    polled: dict[str, Any] = field(default_factory=dict)
    in_flight: int = 0  # requests this router has open on the engine
    local_kv: int = 0  # their estimated context tokens (prompt + streamed events)
    awaiting_first: int = 0  # of those, requests whose first byte has not come back (retryable)
    backlog_s: float = 0.0  # their estimated prefill seconds
    last_error: str = ""
    polled_at: float = 0.0

    @property
    def available(self) -> bool:
        return self.healthy and not self.draining

    def candidate(self) -> Candidate:
        polled_batch = int(self.polled.get("running", 0)) + int(self.polled.get("waiting", 0))
        return Candidate(
            name=self.url,
            batch=max(polled_batch, self.in_flight),
            kv_tokens=max(int(self.polled.get("kv_tokens", 0)), self.local_kv),
            backlog_s=self.backlog_s,
            max_batch=int(self.polled.get("max_num_seqs", 0)),
        )

    def status(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "role": self.role,
            "healthy": self.healthy,
            "draining": self.draining,
            "in_flight": self.in_flight,
            "awaiting_first": self.awaiting_first,
            "local_kv_tokens": self.local_kv,
            "backlog_s": round(self.backlog_s, 6),
            "polled": self.polled,
            "last_error": self.last_error,
        }


def _parse_metrics(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and line[0] != "#" and " " in line:
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                values[name.split("{")[0]] = float(value)
    return values


class Pool:
    def __init__(self, cfg: RouterConfig, client: httpx.AsyncClient) -> None:
        self.cfg, self.client = cfg, client
        self.engines = [EngineState(u, r) for r in ROLES for u in getattr(cfg, r)]
        self._headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}

    def available(self, role: str) -> list[EngineState]:
        return [e for e in self.engines if e.role == role and e.available]

    def mark_failed(self, engine: EngineState, why: str) -> None:
        """A request could not reach the engine: out of the pool until rejoin_after good polls."""
        engine.healthy, engine.good, engine.last_error = False, 0, why

    async def poll(self, engine: EngineState) -> None:
        try:
            report = await self._read_load(engine.url)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self._bad(engine, f"{type(exc).__name__}: {exc}")
            return
        engine.polled, engine.polled_at = report, time.monotonic()
        engine.draining = bool(report.get("draining"))
        if not report.get("healthy", True):
            self._bad(engine, "the engine reports itself down")
            return
        engine.bad, engine.good = 0, engine.good + 1
        if not engine.healthy and (not engine.ever_healthy or engine.good >= self.cfg.rejoin_after):
            engine.healthy = engine.ever_healthy = True
            engine.last_error = ""

    def _bad(self, engine: EngineState, why: str) -> None:
        engine.good, engine.bad, engine.last_error = 0, engine.bad + 1, why
        if engine.bad >= self.cfg.fail_after:
            engine.healthy = False

    async def _read_load(self, url: str) -> dict[str, Any]:
        timeout = self.cfg.poll_timeout_s
        resp = await self.client.get(f"{url}/load", timeout=timeout, headers=self._headers)
        if resp.status_code != 404:
            resp.raise_for_status()
            return dict(resp.json())
        # an engine without /load (another server): its /health says up or draining, /metrics the load
        health = await self.client.get(f"{url}/health", timeout=timeout)
        text = (await self.client.get(f"{url}/metrics", timeout=timeout)).text
        m = _parse_metrics(text)
        state = health.json().get("status", "") if health.status_code in (200, 503) else ""
        if health.status_code not in (200, 503):
            health.raise_for_status()
        return {
            "running": m.get("dsgraph_num_requests_running", m.get("vllm:num_requests_running", 0)),
            "waiting": m.get("dsgraph_num_requests_waiting", m.get("vllm:num_requests_waiting", 0)),
            "draining": state == "draining",
            "healthy": health.status_code == 200 or state == "draining",
        }

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(e) for e in self.engines))

    async def run(self) -> None:
        """Poll every engine each interval until cancelled, each engine on its own: polled together, a
        busy engine slow to answer would hold back every round, and with it the news that another one
        is gone (requests kept going to a killed engine for seconds)."""
        await asyncio.gather(*(self._run_one(e) for e in self.engines))

    async def _run_one(self, engine: EngineState) -> None:
        while True:
            await self.poll(engine)
            await asyncio.sleep(self.cfg.poll_interval_s)
