"""Start the rank processes of one node and talk to them: each rank runs calls it is sent (a function and
its arguments) on its own state, in order. A rank that dies or fails ends the group with an error naming
the rank and the cause, within `timeout_s` of the call; never a hang."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from dsgraph.runtime.distributed.group import Rendezvous, init_group
from dsgraph.runtime.distributed.shared_tables import node_folder, remove
from dsgraph.runtime.server.errors import PublicError

Call = Callable[..., Any]


class RankError(PublicError):
    """A rank died, failed a call, or did not answer in time; the message names the rank and the cause."""

    def __init__(self, rank: int, cause: str) -> None:
        super().__init__(f"rank {rank}: {cause}")
        self.rank, self.cause = rank, cause


def _serve(
    rank: int,
    ep: int,
    rv: Rendezvous,
    platform: str,
    timeout_s: float,
    conn: Connection,
    queues: tuple,
    shared: str,
) -> None:
    """The rank's loop: join the group, then run each call on `state` and answer (ok, value) or
    (error, traceback)."""
    try:
        from dsgraph.platform.devices import bind_rank_device, collective_backend

        bind_rank_device(platform, rank - rv.ranks_here(ep).start)
        init_group(rv, rank, ep, collective_backend(platform), timeout_s)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    import torch.distributed as dist

    state: dict[str, Any] = {"rank": rank, "ep": ep, "inbox": queues[0], "outbox": queues[1]}
    state["shared_dir"], state["first_on_node"] = shared, rank == rv.ranks_here(ep).start
    # votes and counts are host values: over NCCL they take a gloo group of their own
    state["control"] = dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else None
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send(("ok", fn(state, *args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))
    dist.destroy_process_group()


class RankGroup:
    """The ranks `rv.ranks_here(ep)` of this node as child processes (spawned: no inherited state)."""

    def __init__(
        self, ep: int, rv: Rendezvous | None = None, *, platform: str = "cpu", timeout_s: float = 60.0
    ) -> None:
        ctx = mp.get_context("spawn")
        rv = (rv if rv is not None else Rendezvous()).resolved()
        self.ranks = list(rv.ranks_here(ep))
        self.timeout_s = timeout_s
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        # streaming channels beside the call pipes: commands to each rank, messages from all of them
        self.inboxes = [ctx.Queue() for _ in self.ranks]
        self.outbox = ctx.Queue()
        self.shared_dir = node_folder()  # the node's Engram tables (shared_tables.py)
        for rank, inbox in zip(self.ranks, self.inboxes, strict=True):
            parent, child = ctx.Pipe()
            queues = (inbox, self.outbox)
            proc = ctx.Process(
                target=_serve,
                args=(rank, ep, rv, platform, timeout_s, child, queues, self.shared_dir),
                daemon=True,
            )
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        self.closed = False
        self._collect(self.timeout_s * 2)  # the joins

    def call(self, fn: Call, per_rank: Sequence[tuple[Any, ...]] | None = None) -> list[Any]:
        """Run fn(state, *args) on every local rank at once; their results in rank order."""
        if self.closed:
            raise RuntimeError("the rank group has ended")
        self.start(fn, per_rank)
        return self._collect(self.timeout_s)

    def start(self, fn: Call, per_rank: Sequence[tuple[Any, ...]] | None = None) -> None:
        """Send fn(state, *args) to every local rank without waiting (a long-running loop)."""
        if self.closed:
            raise RuntimeError("the rank group has ended")
        args = per_rank if per_rank is not None else [()] * len(self.ranks)
        for conn, a in zip(self.conns, args, strict=True):
            conn.send((fn, tuple(a)))

    def check(self) -> None:
        """Raise RankError if a rank died or a call failed (a long-running loop's end)."""
        self._check_deaths()
        for i, conn in enumerate(self.conns):
            if conn.poll():
                self._take(i, conn, {})
                self._fail(i, "its loop ended")

    def _collect(self, timeout_s: float) -> list[Any]:
        results: dict[int, Any] = {}
        pending = dict(enumerate(self.conns))
        while pending:
            ready = wait(list(pending.values()) + [p.sentinel for p in self.procs], timeout_s)
            if not ready:
                self._fail(min(pending), f"no answer within {timeout_s} s")
            self._check_deaths()
            for i, conn in list(pending.items()):
                if conn in ready or conn.poll():
                    self._take(i, conn, results)
                    del pending[i]
        return [results[i] for i in range(len(self.conns))]

    def _take(self, i: int, conn: Connection, results: dict[int, Any]) -> None:
        try:
            status, value = conn.recv()
        except EOFError:
            self._fail(i, self._death(i))
        if status != "ok":
            wait([p.sentinel for p in self.procs], 1.0)  # a peer's death is the cause of a failed collective
            self._check_deaths()
            self._fail(i, f"failed:\n{value}")
        results[i] = value

    def _check_deaths(self) -> None:
        for i, proc in enumerate(self.procs):
            if not proc.is_alive():  # a rank only exits when the group closes
                self._fail(i, self._death(i))

    def _death(self, i: int) -> str:
        self.procs[i].join(1.0)
        code = self.procs[i].exitcode
        cause = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"the process died ({cause})"

    def _fail(self, i: int, cause: str) -> None:
        self.close(force=True)
        raise RankError(self.ranks[i], cause)

    def close(self, force: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if not force and proc.is_alive():
                try:
                    conn.send(None)
                except OSError:
                    pass
            proc.join(0.1 if force else self.timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        remove(self.shared_dir)
