"""A minimal step driver over the cpu platform, keyed by request id: the slots, pages and step inputs of
`runtime/step_builder.py` with every row's logits. Tests and the oracle comparisons use it; the engine's
C++ scheduler plans steps the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from dsgraph.models.interface import Model as V41Model
from dsgraph.models.interface import ratios
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.runtime.step_builder import CachePool, SeqState, Step, StepBuilder


class StepRunner:
    """Runs the traced step graph of one model on the cpu platform, carrying caches between steps."""

    def __init__(
        self,
        model: V41Model,
        weights: Mapping[str, torch.Tensor],
        *,
        num_slots: int = 8,
        num_pages: int = 64,
        debug: bool = False,
    ) -> None:
        self.model = model
        sizes = CacheSizes(num_slots, {r: num_pages for r in ratios(model.plans)})
        self.session = Session(model, weights, sizes, debug=debug)
        self.pool = CachePool(model, sizes.num_slots, sizes.num_pages)
        self.requests: dict[int, SeqState] = {}
        self.steps = 0

    @property
    def free_slots(self) -> list[int]:
        return self.pool.free_slots

    def add(self, rid: int) -> None:
        self.requests[rid] = self.pool.open()

    def _build(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> Step:
        builder = StepBuilder(self.model, self.pool)
        for rid, new in chunks:
            builder.add(self.requests[rid], new, logits="all")
        return builder.build()

    def step_inputs(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> dict[str, torch.Tensor]:
        """The inputs of a step over (request id, new token ids) chunks, every row's logits wanted."""
        return self._build(chunks).inputs

    def step(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> list[torch.Tensor]:
        """Run one step over (request id, new token ids) chunks; returns each chunk's logits [len, V]."""
        step = self._build(chunks)
        logits = self.session.run(step.inputs)
        step.commit()
        self.steps += 1
        return step.split(logits)

    def release(self, rid: int) -> None:
        """Return request `rid`'s slot and pages (their contents stay until another request writes them)."""
        self.pool.close(self.requests.pop(rid))

    def rollback(self, rid: int, length: int) -> None:
        """Keep the first `length` tokens of request `rid` (a verify step's committed length); forget the
        rest. Nothing in the caches is undone: the rows past `length` left SWA ring entries (the ring has
        ROLLBACK_ROOM spare entries), compressor state ring entries (COMPRESSOR_RING) and compressed entries
        that no later step reads before it overwrites them. Engram lookback is built from `tokens`."""
        req = self.requests[rid]
        if not 0 <= length <= len(req.tokens):
            raise ValueError(f"rollback of request {rid}: length is {length}, expected 0..{len(req.tokens)}")
        del req.tokens[length:]

    @property
    def caches(self) -> dict[str, torch.Tensor]:
        return self.session.caches

    @property
    def last_debug(self) -> dict[str, torch.Tensor]:
        return self.session.last_debug
