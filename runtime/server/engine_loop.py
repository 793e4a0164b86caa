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
from typing import Any

from dsgraph.models.interface import ratios
from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.server.errors import PublicError


class EngineDead(PublicError):
    """The engine thread has stopped; no request can be served."""


@dataclass(frozen=True)
class _Add:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[TokenEvent], None]
    done: concurrent.futures.Future[None]
    fault_after: int | None  # test hook (hooks.FAULT_FIELD): fails the request after that many tokens
    max_chunk: int = 0  # Engine.add_request's: most prompt tokens one step prefills (0: no limit)


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
    kv_tokens: int = 0  # prompt + generated tokens of the requests in the engine (a router's attention load)


class EngineLoop:
    """Thread-safe front of an Engine (which is not thread-safe: only the loop thread touches it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.Queue[_Add | _Abort | None] = queue.Queue()
        self._sinks: dict[int, Callable[[TokenEvent], None]] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="dsgraph-engine", daemon=True)
        self.error: BaseException | None = None  # set while the loop is down
        self.restarts = 0  # times the loop recovered from a failure
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
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        fault_after: int | None = None,
        max_chunk: int = 0,
    ) -> tuple[int, asyncio.Queue[TokenEvent]]:
        """Queue a request; RequestError (bad params, long prompt) is raised here and nothing is queued;
        EngineDead when the engine thread has stopped."""
        return await self._submit(
            lambda rid, sink, done: _Add(rid, prompt_ids, params, sink, done, fault_after, max_chunk)
        )

    async def _submit(self, command: Callable[..., Any]) -> tuple[int, asyncio.Queue[TokenEvent]]:
        """Queue `command(rid, sink, done)` for the engine thread and wait until it was applied."""
        if self.error is not None:
            raise EngineDead(f"the engine is down ({type(self.error).__name__}); retry later")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        rid = next(self._ids)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        sink = lambda e: loop.call_soon_threadsafe(events.put_nowait, e)  # noqa: E731
        self._commands.put(command(rid, sink, done))
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
            self.engine.add_request(cmd.rid, cmd.prompt_ids, cmd.params, max_chunk=cmd.max_chunk)
        except Exception as exc:  # handed to the awaiting request handler
            cmd.done.set_exception(exc)
            return
        if cmd.fault_after is not None:  # only with the server's fault-injection switch on
            from dsgraph.runtime.server.fault_hook import inject_fault

            inject_fault(self.engine, cmd.rid, cmd.fault_after)
        self._sinks[cmd.rid] = cmd.sink
        cmd.done.set_result(None)

    def _run(self) -> None:
        """Serve commands; if serving raises (an engine bug, not one request's failure, which the engine
        isolates itself), every request in flight gets an error event, the engine drops them all, and
        serving starts over (queued requests wait for it). Only a failure to recover leaves the loop dead
        (`error` stays set)."""
        while True:
            try:
                if self._serve():
                    return
            except BaseException as exc:
                self.error = exc
                try:
                    self._reset_engine()
                except BaseException:
                    self._fail_running(exc)
                    self._fail_queued(exc)
                    return  # dead for good: add() raises EngineDead, /health reports it
                # counted before the running requests hear of the failure: a handler on the server's
                # event loop may answer its client, which may read the count, before this thread goes on
                self.restarts += 1
                self._fail_running(exc)
                self.error = None  # queued adds are served by the restarted loop

    def _serve(self) -> bool:
        """Step and apply commands; True when closed."""
        while True:
            try:  # block only when there is nothing to step
                cmd = self._commands.get(block=not self.engine.has_unfinished)
            except queue.Empty:
                self._step()
                self.usage = self._usage()
                continue
            if cmd is None:
                return True
            self._apply(cmd)
            self.usage = self._usage()

    def _reset_engine(self) -> None:
        """Abort and release every request the engine holds, then step once so the scheduler frees them."""
        for rid in list(self.engine.live):
            self.engine.abort(rid)
            self.engine.release(rid)
        for _ in range(4):  # an abort is reported by an otherwise empty step, after the plan in flight
            if not self.engine.has_unfinished:
                break
            self.engine.step()
        self.usage = self._usage()

    def _fail_running(self, exc: BaseException) -> None:
        """Every request in the engine gets an error event instead of waiting forever."""
        message = f"the engine failed ({type(exc).__name__}: {exc}) and dropped every request in flight"
        for sink in self._sinks.values():
            sink(TokenEvent(-1, -1, "", 0.0, [], True, "error", 0, message))
        self._sinks.clear()

    def _fail_queued(self, exc: BaseException) -> None:
        """The loop is dead for good: every queued add is refused (EngineDead)."""
        message = f"the engine is down ({type(exc).__name__})"
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                cmd.done.set_exception(EngineDead(message))

    def _step(self) -> None:
        for event in self.engine.step():
            # a finished request leaves the running ones before its last event goes out: the handler (on
            # the server's event loop) may end its stream, and a drain waiting on it look at num_running,
            # before this thread gets back here
            sink = self._sinks.pop(event.rid, None) if event.finished else self._sinks.get(event.rid)
            if sink is not None:
                sink(event)
            if event.finished:
                self.engine.release(event.rid)  # its events carried everything the handler needs

    def _usage(self) -> Usage:
        sched, total, held = self.engine.scheduler, 0, 0
        for r in ratios(self.engine.model.plans):
            pages = sched.page_usage(r)
            total, held = total + pages.total, held + pages.used - pages.idle
        lookup, hit = self.engine.prefix_cache_stats()
        slots = self._num_slots - sched.native.num_free_slots
        live = getattr(self.engine, "live", {})  # an expert-parallel group keeps its requests in the ranks
        kv = sum(len(r.prompt) + len(r.tokens) for r in live.values() if r.finish is None)
        return Usage(held / total if total else 0.0, slots, self._num_slots, lookup, hit, kv)
