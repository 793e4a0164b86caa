"""Steps that fill one bucket exactly, for warming it when a bundle is compiled: `tokens` rows over
`seqs` sequences (consecutive positions from 0, slots 0.., pages 0..) and `outs` sampled rows. On cuda
running one compiles every kernel the bucket launches (into the bundle's Triton cache) and captures it.
The caches are cleared after."""

from __future__ import annotations

from typing import Any

import numpy as np

from dsgraph.runtime.prefill_truncation import truncated_inputs
from dsgraph.runtime.step_builder import packed_inputs

__all__ = ["warm_inputs", "warm_truncated_inputs"]


def _lengths(tokens: int, seqs: int) -> list[int]:
    base, extra = divmod(tokens, seqs)
    return [base + (1 if i < extra else 0) for i in range(seqs)]


def warm_inputs(model: Any, tokens: int, seqs: int, outs: int) -> dict[str, np.ndarray]:
    """A step of exactly `tokens` rows, `seqs` sequences and `outs` sampled rows (seqs <= tokens,
    outs <= tokens, each sequence shorter than max_model_len)."""
    lengths = _lengths(tokens, seqs)
    if max(lengths) >= model.geo.max_model_len:
        raise ValueError(
            f"warm_inputs: {tokens} rows over {seqs} sequences exceed max_model_len {model.geo.max_model_len}"
        )
    return packed_inputs(model, lengths, outs)


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
    step = packed_inputs(model, lengths, outs, start=1)
    step["sample_rows"] = np.arange(tokens - outs, tokens, dtype=np.int32)
    keep_start, left = np.ones(seqs, np.int32), rows
    for s in reversed(range(seqs)):  # keep each sequence's tail, from the last sequence back
        take = min(lengths[s], left)
        keep_start[s], left = 1 + lengths[s] - take, left - take
    return truncated_inputs(step, keep_start, mode, model.cfg.text.sliding_window)
