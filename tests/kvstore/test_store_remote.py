"""The cross-machine tier on loopback: Mooncake's store (a `mooncake_master` process, the wheel's own)
behind the TieredStore interface. A block one store (machine) writes is a hit for another with no shared
directory; it lands in the reader's host tier; a damaged or expired object is a miss."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsgraph.runtime.kvstore.config import StoreConfig
from dsgraph.runtime.kvstore.remote import MooncakeTier, remote_available
from dsgraph.runtime.kvstore.store import TieredStore

MASTER = Path(sys.executable).parent / "mooncake_master"
pytestmark = pytest.mark.skipif(
    not (remote_available() and MASTER.exists()), reason="mooncake.store or mooncake_master is not available"
)


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    port, metrics = _free_port(), _free_port()  # the master also serves metrics (9003 by default)
    proc = subprocess.Popen(
        [str(MASTER), f"--rpc_port={port}", f"--metrics_port={metrics}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.time() < deadline, "mooncake_master did not start"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _store(master: str, clock=time.time) -> TieredStore:  # type: ignore[no-untyped-def]
    remote = MooncakeTier(master, segment_bytes=16 << 20, buffer_bytes=8 << 20, ttl_s=100.0, clock=clock)
    return TieredStore(StoreConfig(path=None), clock, remote=remote)


def test_a_block_written_on_one_machine_is_a_hit_on_another(master: str) -> None:
    now = [1000.0]
    a, b = _store(master), _store(master, clock=lambda: now[0])
    try:
        payload = os.urandom(5000)
        a.put("k-shared", payload)
        assert b.contains("k-shared") and not b.contains("k-absent")
        assert b.get("k-shared") == payload
        assert b.metrics()["remote"]["hits"] == 1 and b.metrics()["host"]["blocks"] == 1
        assert b.get("k-absent") is None
        # a damaged object is a miss (and removed); so is one past the TTL
        a.remote.store.put("k-bad", b"not a block")  # type: ignore[union-attr]
        assert b.get("k-bad") is None and b.metrics()["remote"]["corrupt"] == 1
        a.put("k-old", b"x" * 100)
        now[0] = time.time() + 1000
        assert b.get("k-old") is None and b.metrics()["remote"]["expired"] == 1
    finally:
        a.close()
        b.close()
