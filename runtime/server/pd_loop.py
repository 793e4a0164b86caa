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
import contextvars
import itertools
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from dsgraph.runtime.engine import Engine, TokenEvent
from dsgraph.runtime.kvstore.handoff import Handoff, HandoffError
from dsgraph.runtime.kvstore.pd_engines import export_running
from dsgraph.runtime.kvstore.transport import TransferError, Transport, pack_payload
from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from dsgraph.runtime.server.engine_loop import EngineDead, EngineLoop, _Abort

DECODE_PATH = "/v1/pd/decode"
# the completion server a router chose for the request being handled (pd_app.RouterHeaders sets it)
DECODE_PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar("dsgraph_decode_peer", default=None)
# the router's prefill chunk size for that request (its x-dsgraph-prefill-chunk header, text as sent)
PREFILL_CHUNK: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dsgraph_prefill_chunk", default=None
)


@dataclass(frozen=True)
class _AddPrefilled:
    rid: int
    handoff: Handoff
    pages: dict[int, list[bytes]]
    params: SamplingParams
    sink: Callable[[TokenEvent], None]
    done: concurrent.futures.Future[None]
    deadline: float  # time.monotonic() past which it is refused instead of waiting for room


@dataclass(frozen=True)
class _MoveAll:
    done: concurrent.futures.Future[int]


MOVED = "moved"  # a TokenEvent finish_reason: the request continues on another completion engine


class CompletionLoop(EngineLoop):
    """An EngineLoop that also admits handoffs (`add_prefilled`) and, when its server drains, hands the
    requests it decodes to other completion engines (`move_all`)."""

    def __init__(self, engine: Engine, admit_timeout_s: float = 60.0) -> None:
        self.admit_timeout_s = admit_timeout_s
        self._pending: deque[_AddPrefilled] = deque()
        self.moving = 0  # moved requests whose next engine has not taken them yet (pd_app._lines)
        self.moved = 0  # requests handed to another engine so far
        super().__init__(engine)

    async def move_all(self) -> int:
        """Hand every request decoding here over (each one's stream gets a MOVED event carrying its
        handoff) and refuse those still waiting for room; returns how many moved."""
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._commands.put(_MoveAll(done))  # type: ignore[arg-type]
        return await asyncio.wrap_future(done)

    def _move_all(self, cmd: _MoveAll) -> None:
        while self._pending:
            self._pending.popleft().done.set_exception(EngineDead("the completion engine is draining"))
        moved = 0
        for rid, sink in list(self._sinks.items()):
            try:
                exported = export_running(self.engine, rid)
            except HandoffError:  # not between two decode steps: it finishes here, within the grace
                continue
            self.engine.abort(rid)
            self.engine.release(rid)
            del self._sinks[rid]
            sink(TokenEvent(rid, -1, "", 0.0, [], True, MOVED, handoff=exported))
            moved += 1
        self.moved += moved
        cmd.done.set_result(moved)

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
        if isinstance(cmd, _MoveAll):
            self._move_all(cmd)
            return
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
    """One JSON line; a log-probability nobody asked for (NaN: the sampler skipped it) is written null."""
    d = asdict(replace(e, handoff=None, prompt_logprobs=None))
    d.pop("handoff"), d.pop("prompt_logprobs")
    if math.isnan(d["logprob"]):
        d["logprob"] = None
    return json.dumps(d)


def event_from_json(line: str) -> TokenEvent:
    d = json.loads(line)
    d["top"] = [tuple(t) for t in d["top"]]
    d["logprob"] = math.nan if d["logprob"] is None else d["logprob"]
    return TokenEvent(**d)


def error_event(message: str) -> TokenEvent:
    return TokenEvent(-1, -1, "", 0.0, [], True, "error", 0, message)


def params_json(params: SamplingParams) -> dict[str, Any]:
    d = {f: getattr(params, f) for f in params.__slots__ if f != "structured_outputs"}  # type: ignore[attr-defined]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def prefill_chunk(header: str | None) -> int:
    """A router's chunk size (tokens per prefill step for this request); 0 without the header."""
    if header is None:
        return 0
    try:
        chunk = int(header)
    except ValueError:
        chunk = 0
    if chunk < 1:
        raise RequestError("x-dsgraph-prefill-chunk", header, "a positive number of tokens")
    return chunk


class PDError(RuntimeError):
    """The completion side refused or lost a request; the message says which stage."""


class NotAdmitted(PDError):
    """The completion server did not take the request (nothing of it was streamed yet)."""


class PromptLoop(EngineLoop):
    """An EngineLoop for a PROMPT engine whose requests decode on a completion server of `peers`: the one
    a router named for the request (DECODE_PEER), else the first."""

    def __init__(
        self,
        engine: Engine,
        peers: str | Sequence[str],
        transport: Transport,
        timeout_s: float = 60.0,
        api_key: str | None = None,
    ) -> None:
        import httpx2 as httpx

        super().__init__(engine)
        names = [peers] if isinstance(peers, str) else list(peers)
        if not names:
            raise ValueError("pd peers: a prompt server needs at least one completion server URL")
        self.peers = tuple(u.rstrip("/") for u in names)
        self.peer, self.transport, self.timeout_s = self.peers[0], transport, timeout_s
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # no read deadline on the token stream: a busy completion engine is slow, not failed (its
        # admission has its own deadline, and a dead server closes the connection)
        timeout = httpx.Timeout(timeout_s, read=None, pool=None)
        # idle connections are dropped before the completion server closes them (uvicorn: after 5 s
        # idle, httpx's default expiry too): a handoff sent on one the server is closing fails with a
        # ReadError before it is admitted, and the request goes back to the router as an error status
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
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
        peer = self.peer_for(DECODE_PEER.get())
        chunk = prefill_chunk(PREFILL_CHUNK.get())
        rid, inner = await super().add(prompt_ids, params, fault_after, chunk)
        out: asyncio.Queue[TokenEvent] = asyncio.Queue()
        task = asyncio.ensure_future(self._relay(inner, out, params, peer))
        self._relays[rid] = task
        task.add_done_callback(lambda _: self._relays.pop(rid, None))
        return rid, out

    def peer_for(self, named: str | None) -> str:
        """The completion server for a request (`named` by a router, None: the first peer); a URL not in
        --pd-peer is refused (a client must not make this server send requests elsewhere)."""
        if named is None:
            return self.peer
        url = named.rstrip("/")
        if url not in self.peers:
            raise RequestError(
                "x-dsgraph-decode-url", named, f"one of this server's --pd-peer URLs {list(self.peers)}"
            )
        return url

    def abort(self, rid: int) -> None:
        super().abort(rid)
        task = self._relays.pop(rid, None)
        if task is not None:
            task.cancel()

    async def _relay(
        self,
        inner: asyncio.Queue[TokenEvent],
        out: asyncio.Queue[TokenEvent],
        params: SamplingParams,
        peer: str,
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
            await self._decode(peer, locator, params, first, out, first.num_cached_tokens)
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
        peer: str,
        locator: dict[str, Any],
        params: SamplingParams,
        first: TokenEvent | None,
        out: asyncio.Queue[TokenEvent],
        cached: int,
        moved_from: Callable[[], Any] | None = None,
    ) -> None:
        """Have `peer` decode the handoff at `locator`, its events into `out`. `first`: emitted once it
        is admitted (None: a moved request continuing); `cached`: the prompt engine's prefix hit (the
        completion engine prefilled nothing); `moved_from`: closes the stream of the engine the request
        moved from once this one has admitted it (that engine keeps the bytes until then)."""
        body = {"locator": locator, "params": params_json(params), "timeout_s": self.timeout_s}
        admitted = False
        try:
            async with self._client.stream("POST", f"{peer}{DECODE_PATH}", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise NotAdmitted(
                        f"the completion server at {peer} answered {resp.status_code}: {text[:500]}"
                    )
                lines = resp.aiter_lines()
                head = json.loads(await anext(lines))
                if "admitted" not in head:
                    raise NotAdmitted(f"the completion server at {peer} did not admit the request: {head}")
                admitted = True
                if moved_from is not None:
                    await moved_from()
                if first is not None:
                    out.put_nowait(first)
                async for line in lines:
                    if not line:
                        continue
                    if line.startswith(f'{{"{MOVED}"'):  # that server drains: on to another one
                        await self._move(peer, json.loads(line)[MOVED], params, out, cached, resp.aclose)
                        return
                    e = replace(event_from_json(line), num_cached_tokens=cached)
                    out.put_nowait(e)
                    if e.finished:
                        return
        except PDError:
            raise
        except Exception as exc:  # connection refused, reset, timeout: httpx's errors
            why = f"the completion server at {peer} failed: {type(exc).__name__}: {exc}"
            raise (PDError if admitted else NotAdmitted)(why) from None
        raise PDError(f"the completion server at {peer} ended the stream before the request finished")

    async def _move(
        self,
        source: str,
        locator: dict[str, Any],
        params: SamplingParams,
        out: asyncio.Queue[TokenEvent],
        cached: int,
        close_source: Callable[[], Any],
    ) -> None:
        """Continue a request that `source` handed off while draining on another of --pd-peer (the
        first that admits it); PDError when none does."""
        why = "this prompt server has no other --pd-peer"
        for peer in (p for p in self.peers if p != source):
            try:
                await self._decode(peer, locator, params, None, out, cached, close_source)
                return
            except NotAdmitted as exc:
                why = str(exc)
        raise PDError(f"the completion server at {source} drained and no other one took the request: {why}")

    def close(self) -> None:
        for task in list(self._relays.values()):
            task.cancel()
        super().close()
        self.transport.close()
