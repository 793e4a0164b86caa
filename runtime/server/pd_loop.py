"""Engine loops of a prefill/decode pair. `CompletionLoop` admits handed-off requests on the engine
thread (queued FIFO while the engine has no room; refused past a deadline). `PromptLoop` runs a request
on the PROMPT engine, publishes its handoff on the transport, asks the completion server to decode it
(`POST /v1/pd/decode`, pd_app.py) and relays that server's token stream into the request's own queue,
so the prompt server answers the client as one NORMAL engine would. The first token is held back until
the completion engine has admitted the request: a failed transfer reaches the client before any output,
with an error status. A stream that breaks later (the completion server died or restarted) ends the
request with an error event, never silently."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.kvstore.handoff import Handoff
from dsgraph.runtime.kvstore.transport import TransferError, Transport, pack_payload
from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.server.engine_loop import EngineDead, EngineLoop, _Abort

DECODE_PATH = "/v1/pd/decode"


@dataclass(frozen=True)
class _AddPrefilled:
    rid: int
    handoff: Handoff
    pages: dict[int, list[bytes]]
    params: SamplingParams
    sink: Callable[[TokenEvent], None]
    done: concurrent.futures.Future[None]
    deadline: float  # time.monotonic() past which it is refused instead of waiting for room


class CompletionLoop(EngineLoop):
    """An EngineLoop that also admits handoffs (`add_prefilled`)."""

    def __init__(self, engine: Engine, admit_timeout_s: float = 60.0) -> None:
        self.admit_timeout_s = admit_timeout_s
        self._pending: deque[_AddPrefilled] = deque()
        super().__init__(engine)

    @property
    def num_pending(self) -> int:
        """Handoffs received and waiting for room (the engine thread's queue)."""
        return len(self._pending)

    async def add_prefilled(
        self, handoff: Handoff, pages: dict[int, list[bytes]], params: SamplingParams
    ) -> tuple[int, asyncio.Queue[TokenEvent]]:
        deadline = time.monotonic() + self.admit_timeout_s
        return await self._submit(
            lambda rid, sink, done: _AddPrefilled(rid, handoff, pages, params, sink, done, deadline)
        )

    def _apply(self, cmd: Any) -> None:
        if not isinstance(cmd, _AddPrefilled):
            if isinstance(cmd, _Abort):  # also for a handoff still waiting for room
                self._drop_pending(cmd.rid)
            super()._apply(cmd)
            return
        self._pending.append(cmd)
        self._admit_pending()

    def _step(self) -> None:
        super()._step()
        self._admit_pending()

    def _admit_pending(self) -> None:
        """Admit queued handoffs in order while there is room; refuse those past their deadline."""
        while self._pending:
            cmd = self._pending[0]
            need = len(cmd.handoff.prompt) + len(cmd.handoff.output) - 1
            if not self.engine.scheduler.can_add_prefilled(need):
                if self.engine.has_unfinished and time.monotonic() < cmd.deadline:
                    return  # room comes back as running requests finish
                self._pending.popleft()
                why = "timed out waiting" if self.engine.has_unfinished else "never has"
                cmd.done.set_exception(
                    TransferError(f"the completion engine {why} room for {need} cached tokens")
                )
                continue
            self._pending.popleft()
            try:
                self.engine.add_prefilled(cmd.rid, cmd.handoff, cmd.pages, cmd.params)
            except Exception as exc:  # handed to the awaiting handler; the engine holds nothing of it
                cmd.done.set_exception(exc)
                continue
            self._sinks[cmd.rid] = cmd.sink
            cmd.done.set_result(None)

    def _drop_pending(self, rid: int) -> None:
        for cmd in list(self._pending):
            if cmd.rid == rid:
                self._pending.remove(cmd)
                cmd.done.cancel()

    def _reset_engine(self) -> None:
        while self._pending:
            self._pending.popleft().done.set_exception(EngineDead("the completion engine restarted"))
        super()._reset_engine()


def event_json(e: TokenEvent) -> str:
    d = asdict(replace(e, handoff=None, prompt_logprobs=None))
    d.pop("handoff"), d.pop("prompt_logprobs")
    return json.dumps(d)


def event_from_json(line: str) -> TokenEvent:
    d = json.loads(line)
    d["top"] = [tuple(t) for t in d["top"]]
    return TokenEvent(**d)


def error_event(message: str) -> TokenEvent:
    return TokenEvent(-1, -1, "", 0.0, [], True, "error", 0, message)


def params_json(params: SamplingParams) -> dict[str, Any]:
    d = {f: getattr(params, f) for f in params.__slots__ if f != "structured_outputs"}  # type: ignore[attr-defined]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


class PDError(RuntimeError):
    """The completion side refused or lost a request; the message says which stage."""


class PromptLoop(EngineLoop):
    """An EngineLoop for a PROMPT engine whose requests decode on the completion server at `peer`."""

    def __init__(
        self,
        engine: Engine,
        peer: str,
        transport: Transport,
        timeout_s: float = 60.0,
        api_key: str | None = None,
    ) -> None:
        import httpx2 as httpx

        super().__init__(engine)
        self.peer, self.transport, self.timeout_s = peer.rstrip("/"), transport, timeout_s
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # no read deadline on the token stream: a busy completion engine is slow, not failed (its
        # admission has its own deadline, and a dead server closes the connection)
        timeout = httpx.Timeout(timeout_s, read=None, pool=None)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits)
        self._relays: dict[int, asyncio.Task[None]] = {}
        self._tag = f"{os.getpid()}-{time.time_ns()}"
        self._handoffs = itertools.count()
        self.failures = 0  # requests ended by a failed handoff or a broken completion stream

    async def add(
        self, prompt_ids: list[int], params: SamplingParams, fault_after: int | None = None
    ) -> tuple[int, asyncio.Queue[TokenEvent]]:
        if params.structured_outputs is not None:
            raise RequestError("structured_outputs", "set", "absent with prefill/decode disaggregation")
        rid, inner = await super().add(prompt_ids, params, fault_after)
        out: asyncio.Queue[TokenEvent] = asyncio.Queue()
        task = asyncio.ensure_future(self._relay(inner, out, params))
        self._relays[rid] = task
        task.add_done_callback(lambda _: self._relays.pop(rid, None))
        return rid, out

    def abort(self, rid: int) -> None:
        super().abort(rid)
        task = self._relays.pop(rid, None)
        if task is not None:
            task.cancel()

    async def _relay(
        self, inner: asyncio.Queue[TokenEvent], out: asyncio.Queue[TokenEvent], params: SamplingParams
    ) -> None:
        event = await inner.get()
        if event.finish_reason != "prefilled":  # ended on the prompt engine (eos, length, error)
            out.put_nowait(event)
            return
        handoff_id = f"{self._tag}-{next(self._handoffs)}"
        published = False
        try:
            exported = event.handoff
            await asyncio.to_thread(exported.wait_written, self.timeout_s)  # its store blocks are readable
            payload = pack_payload(exported.handoff.pack())
            locator = await asyncio.to_thread(self.transport.publish, handoff_id, payload)
            published = True
            first = replace(event, finished=False, finish_reason=None, handoff=None)
            await self._decode(locator, params, first, out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failures += 1
            out.put_nowait(error_event(f"prefill/decode handoff failed: {exc}"))
        finally:
            if published:
                self.transport.discard(handoff_id)

    async def _decode(
        self,
        locator: dict[str, Any],
        params: SamplingParams,
        first: TokenEvent,
        out: asyncio.Queue[TokenEvent],
    ) -> None:
        body = {"locator": locator, "params": params_json(params), "timeout_s": self.timeout_s}
        try:
            async with self._client.stream("POST", f"{self.peer}{DECODE_PATH}", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise PDError(
                        f"the completion server at {self.peer} answered {resp.status_code}: {text[:500]}"
                    )
                lines = resp.aiter_lines()
                head = json.loads(await anext(lines))
                if "admitted" not in head:
                    raise PDError(f"the completion server at {self.peer} did not admit the request: {head}")
                out.put_nowait(first)
                async for line in lines:
                    if not line:
                        continue
                    # the prompt-cache hit is the prompt engine's (the completion engine prefilled nothing)
                    e = replace(event_from_json(line), num_cached_tokens=first.num_cached_tokens)
                    out.put_nowait(e)
                    if e.finished:
                        return
        except PDError:
            raise
        except Exception as exc:  # connection refused, reset, timeout: httpx's errors
            raise PDError(
                f"the completion server at {self.peer} failed: {type(exc).__name__}: {exc}"
            ) from None
        raise PDError(f"the completion server at {self.peer} ended the stream before the request finished")

    def close(self) -> None:
        for task in list(self._relays.values()):
            task.cancel()
        super().close()
        self.transport.close()
