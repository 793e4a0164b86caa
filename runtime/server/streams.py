"""Async stream helpers the server's endpoints share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

__all__ = ["prepend"]

T = TypeVar("T")


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """`first`, then the rest: a stream whose first item was awaited before its response began (so a
    request failing before it gets an error status, not a 200)."""
    yield first
    async for item in rest:
        yield item
