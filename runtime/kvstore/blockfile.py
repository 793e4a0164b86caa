"""One stored object as bytes: a fixed header (magic, format version, payload length, creation time, a
BLAKE2b digest of the payload), then the payload. A file that is truncated, has a wrong magic or version,
or whose payload does not match its digest is rejected (`CorruptBlock`), so a damaged file is a miss and
never a cache of wrong bytes."""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

MAGIC = b"DSKV"
VERSION = 1
_HEADER = struct.Struct("<4sIQd16s")  # magic, version, payload bytes, created (unix s), digest
HEADER_BYTES = _HEADER.size


class CorruptBlock(ValueError):
    """A stored object failed its checks; the message names the file and the check."""


def digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def encode(payload: bytes, created: float) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, len(payload), created, digest(payload)) + payload


def decode(data: bytes, name: str) -> tuple[bytes, float]:
    """(payload, creation time) of an encoded object; CorruptBlock names `name` and what failed."""
    if len(data) < HEADER_BYTES:
        raise CorruptBlock(f"{name}: {len(data)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, size, created, want = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptBlock(f"{name}: header {magic!r} v{version}, expected {MAGIC!r} v{VERSION}")
    payload = data[HEADER_BYTES:]
    if len(payload) != size:
        raise CorruptBlock(f"{name}: payload has {len(payload)} bytes, the header says {size} (truncated?)")
    if digest(payload) != want:
        raise CorruptBlock(f"{name}: payload digest mismatch")
    return payload, created


def read_created(path: Path) -> float:
    """Creation time from a file's header (no payload read); CorruptBlock when the header is bad."""
    with path.open("rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise CorruptBlock(f"{path}: {len(head)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, _, created, _ = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION:
        raise CorruptBlock(f"{path}: header {magic!r} v{version}, expected {MAGIC!r} v{VERSION}")
    return created


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a reader (another engine process) sees the whole file or none: a
    temporary file in the same directory, then renamed over the target. No fsync: the store is a cache,
    a block torn by a power loss fails its checksum and reads as a miss, and an fsync per few-kB block
    capped write-through near 15 MB/s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
