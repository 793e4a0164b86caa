"""One background thread owns the Engine: it takes add/abort commands, steps while requests are
pending and hands each TokenEvent to its request's asyncio queue."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from dsgraph.models.deepseek_v41.step_io import ratios
from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.sampling_params import SamplingParams


class EngineDead(RuntimeError):
    """The engine thread has stopped; no request can be served."""


@dataclass(frozen=True)
class _Add:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[TokenEvent], None]
    done: concurrent.futures.Future[None]
    fault_after: int | None  # test hook: Engine.inject_fault(rid, fault_after)


@dataclass(frozen=True)
class _Abort:
    rid: int


@dataclass(frozen=True)
class Usage:
    """Cache occupancy, published by the engine thread after every command and step (the scheduler is
    not thread-safe, so the metrics never read it directly)."""

    pages_in_use: float = 0.0  # fraction of all ratios' pages held by requests (idle cached pages excluded)
    slots_in_use: int = 0
    num_slots: int = 0
    prefix_lookup_tokens: int = 0
    prefix_hit_tokens: int = 0


class EngineLoop:
    """Thread-safe front of an Engine (which is not thread-safe: only the loop thread touches it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.Queue[_Add | _Abort | None] = queue.Queue()
        self._sinks: dict[int, Callable[[TokenEvent], None]] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="dsgraph-engine", daemon=True)
        self.error: BaseException | None = None
        self._num_slots = engine.scheduler.native.config.num_slots
        self.usage = self._usage()
        self._thread.start()

    @property
    def num_running(self) -> int:
        return len(self._sinks)

    @property
    def num_waiting(self) -> int:
        return self._commands.qsize()

    @property
    def idle(self) -> bool:
        return not self._sinks and self._commands.empty()

    async def add(
        self, prompt_ids: list[int], params: SamplingParams, fault_after: int | None = None
    ) -> tuple[int, asyncio.Queue[TokenEvent]]:
        """Queue a request; RequestError (bad params, long prompt) is raised here and nothing is queued;
        EngineDead when the engine thread has stopped."""
        if self.error is not None:
            raise EngineDead(f"the engine stopped: {self.error!r}")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        rid = next(self._ids)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        sink = lambda e: loop.call_soon_threadsafe(events.put_nowait, e)  # noqa: E731
        self._commands.put(_Add(rid, prompt_ids, params, sink, done, fault_after))
        try:
            await asyncio.wrap_future(done)
        except asyncio.CancelledError:  # the client left while queued: the add still runs, so undo it
            self.abort(rid)
            raise
        return rid, events

    def abort(self, rid: int) -> None:
        self._commands.put(_Abort(rid))

    def close(self) -> None:
        self._commands.put(None)
        self._thread.join(timeout=10)

    def _apply(self, cmd: _Add | _Abort) -> None:
        if isinstance(cmd, _Abort):
            # the engine reports an abort only on an otherwise empty step, so the sink is dropped here
            if self._sinks.pop(cmd.rid, None) is not None:
                self.engine.abort(cmd.rid)
                self.engine.release(cmd.rid)
            return
        try:
            self.engine.add_request(cmd.rid, cmd.prompt_ids, cmd.params)
        except Exception as exc:  # handed to the awaiting request handler
            cmd.done.set_exception(exc)
            return
        if cmd.fault_after is not None:
            self.engine.inject_fault(cmd.rid, cmd.fault_after)
        self._sinks[cmd.rid] = cmd.sink
        cmd.done.set_result(None)

    def _run(self) -> None:
        try:
            while True:
                try:  # block only when there is nothing to step
                    cmd = self._commands.get(block=not self.engine.has_unfinished)
                except queue.Empty:
                    self._step()
                    self.usage = self._usage()
                    continue
                if cmd is None:
                    return
                self._apply(cmd)
                self.usage = self._usage()
        except BaseException as exc:  # a dead loop must be visible: /health reports it
            self.error = exc
            self._fail_all(exc)
            raise

    def _fail_all(self, exc: BaseException) -> None:
        """Every request in flight or queued gets an error instead of waiting forever."""
        message = f"the engine stopped: {exc!r}"
        for sink in self._sinks.values():
            sink(TokenEvent(-1, -1, "", 0.0, [], True, "error", 0, message))
        self._sinks.clear()
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                cmd.done.set_exception(EngineDead(message))

    def _step(self) -> None:
        for event in self.engine.step():
            sink = self._sinks.get(event.rid)
            if sink is not None:
                sink(event)
            if event.finished:
                self._sinks.pop(event.rid, None)
                self.engine.release(event.rid)  # its events carried everything the handler needs

    def _usage(self) -> Usage:
        sched, total, held = self.engine.scheduler, 0, 0
        for r in ratios(self.engine.model.plans):
            pages = sched.page_usage(r)
            total, held = total + pages.total, held + pages.used - pages.idle
        lookup, hit = self.engine.prefix_cache_stats()
        slots = self._num_slots - sched.native.num_free_slots
        return Usage(held / total if total else 0.0, slots, self._num_slots, lookup, hit)
