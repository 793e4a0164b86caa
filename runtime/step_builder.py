"""Typed step inputs for `Session.run`, built from sequences and their new tokens.

A `SeqState` is one sequence's place in a session's caches: its request state slot, its pages of every
compressed-cache ratio and the tokens already written. `CachePool` hands out slots and pages (the C++
scheduler does this for the engine; here it is for direct users of a session and for tests), and a
`StepBuilder` lays chunks of new tokens out in the flat-batch layout of `Model.step_types()`
(models/interface.py):

    step = session.new_step().add(seq, prompt_ids).build()   # a prefill chunk: logits of its last row
    logits = session.run(step)                               # [outs, vocab]; seq.tokens now holds it

A chunk continues its sequence at `len(seq.tokens)`: prefill is a chunk of the prompt (or several
chunks, one per step), decode a chunk of one token. `logits="all"` asks for every row's logits (prompt
scoring, verification), "last" (default) for the last row only, "none" for none (a prefill chunk that
is not the prompt's last). `packed_inputs` lays out synthetic steps of a given shape (bucket warming,
step-time profiling) without a pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dsgraph.models.interface import Model, ratios

__all__ = ["CachePool", "CachePoolError", "SeqState", "Step", "StepBuilder", "packed_inputs"]

LOGITS_CHOICES = ("last", "all", "none")
_COLUMNS = ("token_ids", "positions", "seq_ids", "seq_slot", "seq_start", "seq_end", "lookback")


class CachePoolError(ValueError):
    """The session's caches have no free slot or page left for a sequence."""


@dataclass(eq=False)
class SeqState:
    """One sequence in a session's caches (hand it back with `Session.close_sequence`)."""

    slot: int
    tokens: list[int] = field(default_factory=list)  # tokens whose keys are in the caches
    pages: dict[int, list[int]] = field(default_factory=dict)  # ratio -> physical pages, in order
    is_open: bool = True


class CachePool:
    """Free state slots and pages of one session's caches (`CacheSizes`), first free first."""

    def __init__(self, model: Model, num_slots: int, num_pages: dict[int, int]) -> None:
        self.model, self.ratios = model, ratios(model.plans)
        self.free_slots = list(range(num_slots))
        self.free_pages = {r: list(range(num_pages[r])) for r in self.ratios}

    def open(self) -> SeqState:
        if not self.free_slots:
            raise CachePoolError("open a sequence: every state slot is held (CacheSizes.num_slots)")
        return SeqState(self.free_slots.pop(0))

    def close(self, seq: SeqState) -> None:
        """Return the sequence's slot and pages (their contents stay until another sequence writes them)."""
        if not seq.is_open:
            raise CachePoolError(f"close a sequence: the sequence of slot {seq.slot} is already closed")
        seq.is_open = False
        self.free_slots.append(seq.slot)
        for r, pages in seq.pages.items():
            self.free_pages[r] += pages
        seq.pages = {}

    def reserve(self, seq: SeqState, end: int) -> dict[int, list[int]]:
        """Give `seq` the pages of every ratio that positions 0..end-1 need; returns its pages."""
        geo = self.model.geo
        if end > geo.max_model_len:
            raise CachePoolError(f"a sequence of {end} tokens: longer than max_model_len {geo.max_model_len}")
        for r in self.ratios:
            need = -(-(end // r) // geo.page_size)
            owned = seq.pages.setdefault(r, [])
            if need - len(owned) > len(self.free_pages[r]):
                raise CachePoolError(
                    f"a sequence of {end} tokens needs {need} pages of ratio {r}; "
                    f"{len(owned) + len(self.free_pages[r])} are available (CacheSizes.num_pages[{r}])"
                )
            while len(owned) < need:
                owned.append(self.free_pages[r].pop(0))
        return seq.pages


@dataclass(frozen=True)
class Step:
    """A built step: its inputs by name and, per chunk, the sequence, its new tokens and its logits rows."""

    inputs: dict[str, torch.Tensor]
    chunks: tuple[tuple[SeqState, tuple[int, ...]], ...]
    num_logits: tuple[int, ...]  # rows of logits per chunk, in chunk order

    def split(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """`Session.run`'s logits [outs, vocab] as one [rows, vocab] tensor per chunk."""
        return list(torch.split(logits, list(self.num_logits)))

    def commit(self) -> None:
        """Record each chunk's tokens as written (Session.run does this after the step ran)."""
        for seq, new in self.chunks:
            seq.tokens += new


class StepBuilder:
    """Chunks of new tokens of distinct open sequences -> one `Step` (see the module doc)."""

    def __init__(self, model: Model, pool: CachePool) -> None:
        self.model, self.pool = model, pool
        self._chunks: list[tuple[SeqState, tuple[int, ...], str]] = []

    def add(self, seq: SeqState, tokens: Sequence[int], *, logits: str = "last") -> StepBuilder:
        if logits not in LOGITS_CHOICES:
            raise ValueError(f"logits: {logits!r}, expected one of {LOGITS_CHOICES}")
        if not seq.is_open:
            raise ValueError(f"tokens: the sequence of slot {seq.slot} is closed")
        if any(seq is s for s, _, _ in self._chunks):
            raise ValueError(f"tokens: the sequence of slot {seq.slot} already has a chunk in this step")
        new = tuple(int(t) for t in tokens)
        if not new:
            raise ValueError("tokens: empty, expected at least one token id")
        vocab = self.model.cfg.text.vocab_size
        bad = [t for t in new if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"tokens: id {bad[0]} is outside the vocabulary [0, {vocab})")
        self._chunks.append((seq, new, logits))
        return self

    def build(self) -> Step:
        if not self._chunks:
            raise ValueError("build: the step has no chunk (call add first)")
        geo, m = self.model.geo, self.model.cfg.text.engram_max_ngram_size - 1
        cols: dict[str, list] = {k: [] for k in _COLUMNS}
        tables: dict[int, list[list[int]]] = {r: [] for r in self.pool.ratios}
        rows: list[int] = []
        num_logits: list[int] = []
        for s, (seq, new, logits) in enumerate(self._chunks):
            start, first = len(seq.tokens), len(cols["token_ids"])
            cols["token_ids"] += new
            cols["positions"] += range(start, start + len(new))
            cols["seq_ids"] += [s] * len(new)
            cols["seq_slot"].append(seq.slot)
            cols["seq_start"].append(start)
            cols["seq_end"].append(start + len(new))
            cols["lookback"].append([seq.tokens[-1 - i] if i < start else -1 for i in range(m)])
            for r, pages in self.pool.reserve(seq, start + len(new)).items():
                tables[r].append(pages + [-1] * (geo.pages_per_seq(r) - len(pages)))
            wanted = {"all": range(first, first + len(new)), "last": [first + len(new) - 1], "none": []}
            rows += wanted[logits]
            num_logits.append(len(wanted[logits]))
        out = {k: torch.tensor(v, dtype=torch.int32) for k, v in cols.items()}
        out["lookback"] = out["lookback"].reshape(len(self._chunks), m)
        for r, table in tables.items():
            out[f"block_table_r{r}"] = torch.tensor(table, dtype=torch.int32)
        out["sample_rows"] = torch.tensor(rows, dtype=torch.int32)
        out["is_replay"] = torch.zeros(len(cols["token_ids"]), dtype=torch.int32)
        # no prefix cache here: every sequence holds its SWA keys from position 0
        out["seq_window_start"] = torch.zeros(len(self._chunks), dtype=torch.int32)
        chunks = tuple((seq, new) for seq, new, _ in self._chunks)
        return Step(out, chunks, tuple(num_logits))


def packed_inputs(model: Model, lengths: list[int], outs: int, start: int = 0) -> dict[str, np.ndarray]:
    """A step of sequences of `lengths` rows (consecutive positions from `start` in slots 0, 1, ..., on
    pages 0, 1, ...) whose first `outs` rows are sampled, with placeholder token ids and no lookback: the
    steps that warm a bucket or profile the step time, whose caches are cleared after (no pool holds
    their slots and pages)."""
    geo, text = model.geo, model.cfg.text
    tokens, seqs = sum(lengths), len(lengths)
    out: dict[str, Any] = {
        "token_ids": np.arange(tokens, dtype=np.int32) % text.vocab_size,
        "positions": np.concatenate([np.arange(start, start + m) for m in lengths]).astype(np.int32),
        "seq_ids": np.repeat(np.arange(seqs), lengths).astype(np.int32),
        "seq_slot": np.arange(seqs, dtype=np.int32),
        "seq_start": np.full(seqs, start, np.int32),
        "seq_end": np.asarray(lengths, np.int32) + start,
        "seq_window_start": np.zeros(seqs, np.int32),
        "lookback": np.full((seqs, text.engram_max_ngram_size - 1), -1, np.int32),
        "sample_rows": np.arange(outs, dtype=np.int32),
        "is_replay": np.zeros(tokens, np.int32),
    }
    for r in ratios(model.plans):
        table = np.full((seqs, geo.pages_per_seq(r)), -1, np.int32)
        used = 0
        for s, m in enumerate(lengths):
            need = -(-((start + m) // r) // geo.page_size)  # pages holding the entries of its tokens
            table[s, :need] = np.arange(used, used + need)
            used += need
        out[f"block_table_r{r}"] = table
    return out
