"""Steps that fill one bucket exactly, for warming it when a bundle is compiled: `tokens` rows over
`seqs` sequences (consecutive positions from 0, slots 0.., pages 0..) and `outs` sampled rows. On cuda
running one compiles every kernel the bucket launches (into the bundle's Triton cache) and captures it.
The caches are cleared after."""

from __future__ import annotations

from typing import Any

import numpy as np

from dsgraph.models.interface import ratios
from dsgraph.runtime.prefill_truncation import truncated_inputs

__all__ = ["step_inputs", "warm_inputs", "warm_truncated_inputs"]


def _lengths(tokens: int, seqs: int) -> list[int]:
    base, extra = divmod(tokens, seqs)
    return [base + (1 if i < extra else 0) for i in range(seqs)]


def step_inputs(model: Any, lengths: list[int], outs: int, start: int = 0) -> dict[str, np.ndarray]:
    """A step of sequences of `lengths` rows (consecutive positions from `start` in slots 0, 1, ..., on
    pages 0, 1, ...) whose first `outs` rows are sampled."""
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


def warm_inputs(model: Any, tokens: int, seqs: int, outs: int) -> dict[str, np.ndarray]:
    """A step of exactly `tokens` rows, `seqs` sequences and `outs` sampled rows (seqs <= tokens,
    outs <= tokens, each sequence shorter than max_model_len)."""
    lengths = _lengths(tokens, seqs)
    if max(lengths) >= model.geo.max_model_len:
        raise ValueError(
            f"warm_inputs: {tokens} rows over {seqs} sequences exceed max_model_len {model.geo.max_model_len}"
        )
    return step_inputs(model, lengths, outs)


def warm_truncated_inputs(
    model: Any, tokens: int, seqs: int, outs: int, kept: int, mode: str
) -> dict[str, np.ndarray] | None:
    """A truncated-prefill step of exactly `tokens` rows, `seqs` sequences and `outs` sampled rows that
    runs in the truncated bucket (`kept` decoder rows for compact; mask keeps every row). Every sequence
    starts at position 1 with its suffix starting at or after it, so even a step that keeps every row has
    a window reaching below its suffix (as the first chunk of a suffix does); the kept rows are the tails
    of the last sequences, and the sampled rows the last rows of the step. None for a bucket no step can
    reach (it samples more rows than it keeps)."""
    rows = kept if mode == "compact" else tokens
    if not 1 <= outs <= rows <= tokens:
        return None
    lengths = _lengths(tokens, seqs)
    step = step_inputs(model, lengths, outs, start=1)
    step["sample_rows"] = np.arange(tokens - outs, tokens, dtype=np.int32)
    keep_start, left = np.ones(seqs, np.int32), rows
    for s in reversed(range(seqs)):  # keep each sequence's tail, from the last sequence back
        take = min(lengths[s], left)
        keep_start[s], left = 1 + lengths[s] - take, left - take
    return truncated_inputs(step, keep_start, mode, model.cfg.text.sliding_window)
