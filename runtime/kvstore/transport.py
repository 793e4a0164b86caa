"""How a handoff's bytes travel from a PROMPT engine's process to a COMPLETION engine's: the prompt side
`publish`es a payload under an id and gets a locator (a short JSON-able dict) that it sends along with the
request; the completion side `fetch`es the bytes from that locator (a pull: it reads when it is ready to
admit); the prompt side `discard`s the payload once the peer has it or the request ended.

Backends (both existing libraries; nothing here speaks its own wire protocol):
  "mooncake": Mooncake's transfer engine (`mooncake-transfer-engine-non-cuda` on a CPU machine; its CUDA
      builds on a GPU one) over TCP: the payload sits in a registered buffer of the prompt process and
      the completion process reads it with one `transfer_sync_read`. It needs libibverbs.so.1 at import
      (Debian's libibverbs1) even for TCP.
  "torch": torch.distributed's TCPStore (shipped with torch): the prompt process hosts a store, the
      payload is one key, the completion process reads it with `get`. The fallback where Mooncake does
      not import.
A payload is a checksummed block (blockfile.encode), so a damaged or truncated transfer is detected."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from typing import Any, Protocol

from dsgraph.runtime.kvstore import blockfile

Locator = dict[str, Any]
BACKENDS = ("auto", "mooncake", "torch")


class TransferError(RuntimeError):
    """A transfer failed or timed out; the message names the backend, the peer and what happened."""


class Transport(Protocol):
    name: str

    def publish(self, handoff_id: str, payload: bytes) -> Locator: ...

    def fetch(self, locator: Locator, timeout_s: float) -> bytes: ...

    def discard(self, handoff_id: str) -> None: ...

    def close(self) -> None: ...


def mooncake_available() -> bool:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def make_transport(backend: str = "auto", host: str = "127.0.0.1") -> Transport:
    """A transport bound to `host` (the address peers reach this process at). "auto": Mooncake when it
    imports, else torch's TCPStore."""
    if backend not in BACKENDS:
        raise ValueError(f"pd transport: {backend!r}, expected one of {BACKENDS}")
    if backend == "mooncake" or (backend == "auto" and mooncake_available()):
        return MooncakeTransport(host)
    return TorchStoreTransport(host)


def _bounded(what: str, timeout_s: float, work: Callable[[], bytes]) -> bytes:
    """Run a blocking read with a deadline (the libraries' own reads may wait longer)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="dsgraph-pd-fetch")
    try:
        return pool.submit(work).result(timeout=timeout_s)
    except FutureTimeout:
        raise TransferError(f"{what}: timed out after {timeout_s:g} s") from None
    finally:
        pool.shutdown(wait=False)


class MooncakeTransport:
    """Mooncake transfer engine, TCP protocol, peer-to-peer handshake (no metadata server)."""

    name = "mooncake"

    def __init__(self, host: str = "127.0.0.1") -> None:
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        if self.engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
            raise TransferError(f"mooncake: the transfer engine did not start on {host}")
        self.session = f"{host}:{self.engine.get_rpc_port()}"
        self._held: dict[str, ctypes.Array[ctypes.c_char]] = {}
        self._lock = threading.Lock()

    def publish(self, handoff_id: str, payload: bytes) -> Locator:
        buf = ctypes.create_string_buffer(payload, len(payload))
        addr = ctypes.addressof(buf)
        if self.engine.register_memory(addr, len(payload)) != 0:
            raise TransferError(f"mooncake: registering {len(payload)} bytes for {handoff_id} failed")
        with self._lock:
            self._held[handoff_id] = buf
        return {"backend": self.name, "session": self.session, "addr": addr, "length": len(payload)}

    def fetch(self, locator: Locator, timeout_s: float) -> bytes:
        length, peer = int(locator["length"]), str(locator["session"])
        buf = ctypes.create_string_buffer(length)
        addr = ctypes.addressof(buf)
        if self.engine.register_memory(addr, length) != 0:
            raise TransferError(f"mooncake: registering a {length}-byte receive buffer failed")

        def read() -> bytes:
            rc = self.engine.transfer_sync_read(peer, addr, int(locator["addr"]), length)
            if rc != 0:
                raise TransferError(f"mooncake: reading {length} bytes from {peer} failed (status {rc})")
            return buf.raw

        try:
            return _bounded(f"mooncake read of {length} bytes from {peer}", timeout_s, read)
        finally:
            self.engine.unregister_memory(addr)

    def discard(self, handoff_id: str) -> None:
        with self._lock:
            buf = self._held.pop(handoff_id, None)
        if buf is not None:
            self.engine.unregister_memory(ctypes.addressof(buf))

    def close(self) -> None:
        for handoff_id in list(self._held):
            self.discard(handoff_id)


class TorchStoreTransport:
    """torch.distributed.TCPStore: this process hosts one store; peers read keys from it."""

    name = "torch"

    def __init__(self, host: str = "127.0.0.1") -> None:
        from torch.distributed import TCPStore

        self.host = host
        self.store = TCPStore(host, 0, is_master=True, wait_for_workers=False, use_libuv=True)
        self._peers: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()

    def publish(self, handoff_id: str, payload: bytes) -> Locator:
        self.store.set(f"pd/{handoff_id}", payload)
        return {"backend": self.name, "host": self.host, "port": self.store.port, "key": f"pd/{handoff_id}"}

    def _peer(self, host: str, port: int, timeout_s: float) -> Any:
        from torch.distributed import TCPStore

        with self._lock:
            store = self._peers.get((host, port))
            if store is None:
                store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
                self._peers[(host, port)] = store
            return store

    def fetch(self, locator: Locator, timeout_s: float) -> bytes:
        host, port, key = str(locator["host"]), int(locator["port"]), str(locator["key"])
        what = f"torch TCPStore read of {key} from {host}:{port}"
        start = time.monotonic()

        def read() -> bytes:
            try:
                store = self._peer(host, port, timeout_s)
                left = max(timeout_s - (time.monotonic() - start), 0.01)
                store.set_timeout(timedelta(seconds=left))
                return bytes(store.get(key))
            except Exception as exc:  # the store's errors: connection refused, timeout, missing key
                with self._lock:
                    self._peers.pop((host, port), None)
                raise TransferError(f"{what} failed: {exc}") from None

        return _bounded(what, timeout_s, read)

    def discard(self, handoff_id: str) -> None:
        self.store.delete_key(f"pd/{handoff_id}")

    def close(self) -> None:
        self._peers.clear()


def pack_payload(packed_handoff: bytes) -> bytes:
    return blockfile.encode(packed_handoff, time.time())


def unpack_payload(payload: bytes, what: str) -> bytes:
    """The handoff bytes of a payload; TransferError when the checksum or length does not match."""
    try:
        return blockfile.decode(payload, what)[0]
    except blockfile.CorruptBlock as exc:
        raise TransferError(f"damaged transfer: {exc}") from None
