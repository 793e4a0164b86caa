"""The serving loop of one rank: apply the commands the front sends (add, abort, release), step while the
rank has requests, take part in the group's rounds while it has none; report token events, usage and
EPLB statistics to the front."""

from __future__ import annotations

import queue
import time
from typing import Any

IDLE_SLEEP_S = 0.002  # between rounds while every rank is idle: the group's heartbeat


def _usage(engine: Any, setup: Any) -> dict[str, Any]:
    from dsgraph.models.interface import ratios

    sched = engine.scheduler
    pages = {
        r: tuple(getattr(sched.page_usage(r), k) for k in ("total", "used", "idle"))
        for r in ratios(engine.model.plans)
    }
    return dict(
        pages=pages,
        num_slots=sched.native.config.num_slots,
        free_slots=sched.native.num_free_slots,
        prefix=engine.prefix_cache_stats(),
        eplb=setup.load_stats(),
    )


def _apply(engine: Any, cmd: tuple, rank: int, outbox: Any) -> None:
    kind, rid = cmd[0], cmd[1]
    if kind == "add":
        try:
            engine.add_request(rid, cmd[2], cmd[3], seed=cmd[4], max_chunk=cmd[5])
            outbox.put(("ack", rank, rid, None))
        except Exception as exc:  # the front re-raises it in the caller
            why = (exc.field, exc.value, exc.expected) if hasattr(exc, "field") else (str(exc),)
            outbox.put(("ack", rank, rid, (type(exc).__name__, why)))
    elif kind == "abort":
        engine.abort(rid)
        engine.release(rid)
    elif kind == "release":
        engine.release(rid)
    elif kind == "fault":  # the server's test hook (runtime/server/fault_hook.py), sent only when on
        from dsgraph.runtime.server.fault_hook import inject_fault

        inject_fault(engine, rid, cmd[2])


def rank_serve(state: dict[str, Any]) -> None:
    engine, setup = state["llm"].engine, state["setup"]
    inbox, outbox, rank = state["inbox"], state["outbox"], state["rank"]
    outbox.put(("usage", rank, _usage(engine, setup)))
    while True:
        while True:
            try:
                cmd = inbox.get_nowait()
            except queue.Empty:
                break
            if cmd is None:
                return
            _apply(engine, cmd, rank, outbox)
        if engine.has_unfinished:
            events = engine.step()
            outbox.put(("events", rank, events, _usage(engine, setup)))
        elif not setup.lockstep.idle():
            time.sleep(IDLE_SLEEP_S)
