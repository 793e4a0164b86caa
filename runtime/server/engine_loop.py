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

from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.sampling_params import SamplingParams


@dataclass(frozen=True)
class _Add:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[TokenEvent], None]
    done: concurrent.futures.Future[None]


@dataclass(frozen=True)
class _Abort:
    rid: int


class EngineLoop:
    """Thread-safe front of an Engine (which is not thread-safe: only the loop thread touches it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.Queue[_Add | _Abort | None] = queue.Queue()
        self._sinks: dict[int, Callable[[TokenEvent], None]] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="dsgraph-engine", daemon=True)
        self.error: BaseException | None = None
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
        self, prompt_ids: list[int], params: SamplingParams
    ) -> tuple[int, asyncio.Queue[TokenEvent]]:
        """Queue a request; RequestError (bad params, long prompt) is raised here and nothing is queued."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        rid = next(self._ids)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._commands.put(
            _Add(rid, prompt_ids, params, lambda e: loop.call_soon_threadsafe(events.put_nowait, e), done)
        )
        await asyncio.wrap_future(done)
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
        self._sinks[cmd.rid] = cmd.sink
        cmd.done.set_result(None)

    def _run(self) -> None:
        try:
            while True:
                try:  # block only when there is nothing to step
                    cmd = self._commands.get(block=not self.engine.has_unfinished)
                except queue.Empty:
                    self._step()
                    continue
                if cmd is None:
                    return
                self._apply(cmd)
        except BaseException as exc:  # a dead loop must be visible: /health reports it
            self.error = exc
            for sink in self._sinks.values():
                sink(TokenEvent(-1, -1, "", 0.0, [], True, "error"))
            raise

    def _step(self) -> None:
        for event in self.engine.step():
            sink = self._sinks.get(event.rid)
            if sink is not None:
                sink(event)
            if event.finished:
                self._sinks.pop(event.rid, None)
                self.engine.release(event.rid)  # its events carried everything the handler needs
