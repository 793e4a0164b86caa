"""Steps that fill one bucket exactly, for warming it when a bundle is compiled: `tokens` rows over
`seqs` sequences (consecutive positions from 0, slots 0.., pages 0..) and `outs` sampled rows. On cuda
running one compiles every kernel the bucket launches (into the bundle's Triton cache) and captures it.
The caches are cleared after."""

from __future__ import annotations

from typing import Any

import numpy as np

from dsgraph.models.interface import ratios

__all__ = ["step_inputs", "warm_inputs"]


def _lengths(tokens: int, seqs: int) -> list[int]:
    base, extra = divmod(tokens, seqs)
    return [base + (1 if i < extra else 0) for i in range(seqs)]


def step_inputs(model: Any, lengths: list[int], outs: int) -> dict[str, np.ndarray]:
    """A step of sequences of `lengths` rows (consecutive positions from 0 in slots 0, 1, ..., on pages
    0, 1, ...) whose first `outs` rows are sampled."""
    geo, text = model.geo, model.cfg.text
    tokens, seqs = sum(lengths), len(lengths)
    out: dict[str, Any] = {
        "token_ids": np.arange(tokens, dtype=np.int32) % text.vocab_size,
        "positions": np.concatenate([np.arange(m) for m in lengths]).astype(np.int32),
        "seq_ids": np.repeat(np.arange(seqs), lengths).astype(np.int32),
        "seq_slot": np.arange(seqs, dtype=np.int32),
        "seq_start": np.zeros(seqs, np.int32),
        "seq_end": np.asarray(lengths, np.int32),
        "seq_window_start": np.zeros(seqs, np.int32),
        "lookback": np.full((seqs, text.engram_max_ngram_size - 1), -1, np.int32),
        "sample_rows": np.arange(outs, dtype=np.int32),
        "is_replay": np.zeros(tokens, np.int32),
    }
    for r in ratios(model.plans):
        table = np.full((seqs, geo.pages_per_seq(r)), -1, np.int32)
        used = 0
        for s, m in enumerate(lengths):
            need = -(-(m // r) // geo.page_size)  # pages holding the entries of m tokens
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
