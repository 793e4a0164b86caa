"""Bounds on what one request may make the server do: body size (checked while the body arrives, before
any parsing), JSON nesting depth (checked on the raw bytes, before the recursive parser runs), array
lengths, and the pool that prepares requests (parse, render, tokenize) away from the event loop.

Every endpoint reads its body through `read_json`, so a new endpoint gets the same limits and errors."""

from __future__ import annotations

import ctypes
import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsgraph.runtime.server.errors import ApiError

# Seconds a draining server waits for requests in flight (POST /admin/drain's grace_s, SIGTERM's
# --shutdown-timeout): DeepSeek's decode engines get one minute before they hand off what is left (a
# Kubernetes pod needs terminationGracePeriodSeconds above it: its default is 30). Here rather than in
# lifecycle.py so the CLI parses without uvicorn.
DEFAULT_GRACE_S = 60.0

MiB = 1 << 20
TRIM_AFTER_BYTES = MiB  # bodies from this size hand their freed memory back to the system
# A JSON string (escapes included); the unrolled form keeps the regex linear on long strings.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


@dataclass(frozen=True)
class ServerLimits:
    """The server's request limits; the defaults are far above what a valid request of the model needs
    (8 MiB is about two million tokens of text) and far below what exhausts memory."""

    max_body_bytes: int = 8 * MiB
    max_json_depth: int = 64
    max_array_items: int = 262_144
    prepare_workers: int = 2  # threads that parse, render and tokenize requests

    def __post_init__(self) -> None:
        for name, low in (
            ("max_body_bytes", 1024),
            ("max_json_depth", 8),
            ("max_array_items", 16),
            ("prepare_workers", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: {value!r}, expected an integer >= {low}")


class ClientGone(Exception):
    """The client closed the connection before its request was answered (counted as status 499)."""


def too_large(limits: ServerLimits, size: int) -> ApiError:
    return ApiError(
        413,
        f"request body: {size} bytes or more, the limit is {limits.max_body_bytes} bytes "
        "(--max-request-body-bytes)",
        code="request_too_large",
    )


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, limits: ServerLimits) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed the limit (from Content-Length, or
    while it arrives for a chunked body): an oversized body is never held in full."""
    if content_length is not None and content_length.isdigit():
        if int(content_length) > limits.max_body_bytes:
            raise too_large(limits, int(content_length))
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise too_large(limits, size)
        parts.append(chunk)
    return b"".join(parts)


def json_depth(body: bytes) -> int:
    """Nesting depth of a JSON text, from its brackets outside strings (no parse, no recursion)."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) * 2 - 1
    return int(np.cumsum(steps).max())


def _key_before(body: bytes, pos: int) -> str | None:
    """The object key nearest before byte `pos`: the field a JSON syntax error is most likely in."""
    keys = re.findall(rb'"([^"\\]{1,200})"\s*:', body[max(0, pos - 4096) : pos])
    return keys[-1].decode(errors="replace") if keys else None


def parse_json(body: bytes, limits: ServerLimits) -> Any:
    """The parsed body; 400 naming the limit for too deep nesting or too long arrays, the field of a
    NaN or Infinity, and the position and nearest field of malformed JSON."""
    depth = json_depth(body)
    if depth > limits.max_json_depth:
        raise ApiError(
            400, f"request body: JSON nested {depth} levels deep, the limit is {limits.max_json_depth}"
        )
    try:
        values = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        pos = getattr(exc, "pos", None)
        field = _key_before(body, pos) if isinstance(pos, int) else None
        where = f" (in field {field!r})" if field else ""
        raise ApiError(400, f"invalid JSON request{where}: {exc}", field) from exc
    _check_values(values, limits.max_array_items)
    return values


def _check_values(values: Any, limit: int) -> None:
    """Every array at most `limit` items, every number finite (Python's parser takes NaN and Infinity,
    which JSON has not). Iterative: the depth is bounded, the width need not be."""
    todo: list[tuple[str, Any]] = [("", values)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, dict):
            todo.extend((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            if len(value) > limit:
                field = path or "request body"
                raise ApiError(400, f"{field}: an array of {len(value)} items, the limit is {limit}", path)
            todo.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            field = path or "request body"
            raise ApiError(
                400, f"{field}: {value}, expected a finite number (JSON has no NaN or Infinity)", path
            )


def release_memory() -> None:
    """Hand freed heap memory back to the system. glibc keeps what a large request freed in its per-thread
    arenas, so without this the resident size stays at its peak; elsewhere this does nothing."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim
