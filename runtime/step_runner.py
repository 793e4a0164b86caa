"""A minimal step driver over the cpu platform: cache memory, per-request slots and pages, and the
step inputs of the flat-batch layout. Tests and the oracle comparisons use it; the C++ scheduler of
the runtime issue plans steps the same way and replaces the Python bookkeeping here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from dsgraph.models.interface import Model as V41Model
from dsgraph.models.interface import ratios
from dsgraph.runtime.session import CacheSizes, Session


@dataclass
class Request:
    slot: int
    tokens: list[int] = field(default_factory=list)  # tokens already in the caches
    pages: dict[int, list[int]] = field(default_factory=dict)  # ratio -> physical pages


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
        self.session = Session(
            model, weights, CacheSizes(num_slots, {r: num_pages for r in ratios(model.plans)}), debug=debug
        )
        self.free_slots = list(range(num_slots))
        self.free_pages = {r: list(range(num_pages)) for r in ratios(model.plans)}
        self.requests: dict[int, Request] = {}
        self.steps = 0

    def add(self, rid: int) -> None:
        self.requests[rid] = Request(self.free_slots.pop(0))

    def _pages(self, req: Request, end: int) -> dict[int, list[int]]:
        page = self.model.geo.page_size
        for r in ratios(self.model.plans):
            need = -(-(end // r) // page)
            owned = req.pages.setdefault(r, [])
            while len(owned) < need:
                owned.append(self.free_pages[r].pop(0))
        return req.pages

    def step_inputs(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> dict[str, torch.Tensor]:
        geo, m = self.model.geo, self.model.cfg.text.engram_max_ngram_size - 1
        cols: dict[str, list] = {
            k: []
            for k in ("token_ids", "positions", "seq_ids", "seq_slot", "seq_start", "seq_end", "lookback")
        }
        tables: dict[int, list[list[int]]] = {r: [] for r in ratios(self.model.plans)}
        for s, (rid, new) in enumerate(chunks):
            req = self.requests[rid]
            start = len(req.tokens)
            cols["token_ids"] += list(new)
            cols["positions"] += range(start, start + len(new))
            cols["seq_ids"] += [s] * len(new)
            cols["seq_slot"].append(req.slot)
            cols["seq_start"].append(start)
            cols["seq_end"].append(start + len(new))
            cols["lookback"].append([req.tokens[-1 - i] if i < start else -1 for i in range(m)])
            for r, pages in self._pages(req, start + len(new)).items():
                width = geo.pages_per_seq(r)
                tables[r].append(pages + [-1] * (width - len(pages)))
        out = {k: torch.tensor(v, dtype=torch.int32) for k, v in cols.items()}
        for r, rows in tables.items():
            out[f"block_table_r{r}"] = torch.tensor(rows, dtype=torch.int32)
        out["sample_rows"] = torch.arange(len(cols["token_ids"]), dtype=torch.int32)
        out["is_replay"] = torch.zeros(len(cols["token_ids"]), dtype=torch.int32)
        # No prefix cache here: every request holds its SWA keys from position 0.
        out["seq_window_start"] = torch.zeros(len(chunks), dtype=torch.int32)
        return out

    def step(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> list[torch.Tensor]:
        """Run one step over (request id, new token ids) chunks; returns each chunk's logits [len, V]."""
        logits = self.session.run(self.step_inputs(chunks))
        for rid, new in chunks:
            self.requests[rid].tokens += list(new)
        self.steps += 1
        return list(torch.split(logits, [len(new) for _, new in chunks]))

    def release(self, rid: int) -> None:
        """Return request `rid`'s slot and pages (their contents stay until another request writes them)."""
        req = self.requests.pop(rid)
        self.free_slots.append(req.slot)
        for r, pages in req.pages.items():
            self.free_pages[r] += pages

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
