"""The request channel between nodes of an expert-parallel group: node 0's API process (front.py) sends
requests to the ranks of every node, and each other node's process relays them.

Node 0 listens on `--master-addr`, port `--master-port` + 1 (the rendezvous port itself belongs to
torch.distributed's store). Every other node's process, once its ranks joined the group, connects there
(retrying until the group timeout), announces its global ranks with their first usage report, then
forwards: commands from the front to its ranks' inboxes, and its ranks' messages (acks, token events,
usage) to the front. A relay whose rank dies tells the front which rank and why before it ends; a relay
whose front goes away closes its ranks. Messages are pickled: the channel authenticates both ends with
an HMAC of `DSGRAPH_EP_SECRET` (default: a key derived from the rendezvous address, enough to keep two
groups of one machine apart but no protection on an untrusted network, like torch.distributed's own
rendezvous).
"""

from __future__ import annotations

import queue
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from dsgraph.platform import env
from dsgraph.runtime.distributed.group import Rendezvous
from dsgraph.runtime.distributed.launch import RankError, RankGroup

POLL_S = 0.05
RETRY_S = 0.2


def node_address(rv: Rendezvous) -> tuple[str, int]:
    if rv.master_port + 1 > 65535:
        raise ValueError(f"--master-port is {rv.master_port}: the node channel needs port + 1 <= 65535")
    return rv.master_addr, rv.master_port + 1


def _authkey(rv: Rendezvous) -> bytes:
    secret = str(env.read("DSGRAPH_EP_SECRET"))
    return (secret or f"dsgraph-ep:{rv.master_addr}:{rv.master_port}").encode()


class NodeLinks:
    """Node 0's side: one connection per other node; their messages join the local ranks' outbox."""

    def __init__(self, rv: Rendezvous, ep: int, outbox: Any) -> None:
        self.rv, self.ep, self.outbox = rv, ep, outbox
        addr = node_address(rv)
        try:
            self.listener = Listener(addr, authkey=_authkey(rv))
        except OSError as exc:
            raise ValueError(
                f"--master-port {rv.master_port}: node 0 cannot listen on {addr} ({exc})"
            ) from None
        self.conn_of: dict[int, Connection] = {}  # global rank -> its node's connection
        self.locks: dict[int, threading.Lock] = {}

    def accept(self, timeout_s: float) -> None:
        """Wait for the other nodes (each announces its ranks and their usage)."""
        done: dict[int, tuple[Connection, list[int], dict[int, Any]]] = {}

        def take() -> None:
            for _ in range(self.rv.nnodes - 1):
                conn = self.listener.accept()
                _, node, ranks, usage = conn.recv()
                done[node] = (conn, ranks, usage)

        t = threading.Thread(target=take, daemon=True)
        t.start()
        t.join(timeout_s)
        missing = sorted(set(range(1, self.rv.nnodes)) - set(done))
        if missing:
            self.listener.close()
            first = self.ep // self.rv.nnodes * missing[0]
            raise RankError(first, f"node {missing[0]} did not connect to node 0 within {timeout_s} s")
        for node, (conn, ranks, usage) in done.items():
            lock = threading.Lock()
            for r in ranks:
                self.conn_of[r], self.locks[r] = conn, lock
                self.outbox.put(("usage", r, usage[r]))
            threading.Thread(target=self._read, args=(conn, node, ranks[0]), daemon=True).start()

    def _read(self, conn: Connection, node: int, first: int) -> None:
        try:
            while True:
                self.outbox.put(conn.recv())
        except (EOFError, OSError) as exc:
            self.outbox.put(("dead", first, f"node {node}'s channel closed ({type(exc).__name__})"))

    def send(self, rank: int, cmd: tuple) -> None:
        with self.locks[rank]:
            self.conn_of[rank].send((rank, cmd))

    def close(self) -> None:
        for conn in set(self.conn_of.values()):
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        self.listener.close()


def _connect(rv: Rendezvous, timeout_s: float, first: int) -> Connection:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client(node_address(rv), authkey=_authkey(rv))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise RankError(
                    first, f"node 0 at {node_address(rv)} did not accept within {timeout_s} s"
                ) from None
            time.sleep(RETRY_S)


def relay(group: RankGroup, rv: Rendezvous, usage: dict[int, Any], timeout_s: float) -> None:
    """A node other than 0: serve the front's commands to this node's ranks until the front or a rank
    ends (a dead rank is reported to the front, then raised here)."""
    conn = _connect(rv, timeout_s, group.ranks[0])
    conn.send(("hello", rv.node_rank, group.ranks, usage))
    first, ended = group.ranks[0], threading.Event()

    def commands() -> None:
        try:
            while (msg := conn.recv()) is not None:
                rank, cmd = msg
                group.inboxes[rank - first].put(cmd)
        except (EOFError, OSError):
            pass
        ended.set()

    threading.Thread(target=commands, daemon=True).start()
    try:
        while not ended.is_set():
            try:
                conn.send(group.outbox.get(timeout=POLL_S))
            except queue.Empty:
                try:
                    group.check()
                except RankError as exc:
                    conn.send(("dead", exc.rank, exc.cause))
                    raise
    finally:
        for inbox in group.inboxes:
            inbox.put(None)
        group.close(force=True)
        conn.close()
