"""Step inputs for the benchmark: one prefill chunk of a fresh sequence, or a decode step of B requests
at a given context length whose caches were filled with random valid bytes (decode reads the cache
whatever it holds, so no prefill of B x context tokens is needed). Layouts follow
`models/deepseek_v41/step_io.py` and `runtime/scheduler.py` `model_inputs`."""

from __future__ import annotations

import numpy as np

from dsgraph.models.deepseek_v41.model import V41Model
from dsgraph.models.deepseek_v41.step_io import ratios


def pages_for(model: V41Model, ratio: int, context: int) -> int:
    entries = -(-context // ratio)
    return -(-entries // model.geo.page_size)


def _block_tables(model: V41Model, seqs: int, context: int) -> dict[str, np.ndarray]:
    out = {}
    for r in ratios(model.plans):
        width, used = model.geo.pages_per_seq(r), pages_for(model, r, context)
        table = np.full((seqs, width), -1, dtype=np.int32)
        table[:, :used] = np.arange(seqs * used, dtype=np.int32).reshape(seqs, used)
        out[f"block_table_r{r}"] = table
    return out


def _lookback(model: V41Model, rng: np.random.Generator, seqs: int) -> np.ndarray:
    n = model.cfg.text.engram_max_ngram_size - 1
    return rng.integers(0, model.cfg.text.vocab_size, (seqs, n), dtype=np.int32)


def decode_step(model: V41Model, batch: int, context: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Request b owns slot b and pages [b*n, (b+1)*n) of each ratio; its new token sits at context - 1."""
    rng = np.random.default_rng(seed)
    pos = np.full(batch, context - 1, dtype=np.int32)
    seqs = np.arange(batch, dtype=np.int32)
    return {
        "token_ids": rng.integers(0, model.cfg.text.vocab_size, batch, dtype=np.int32),
        "positions": pos,
        "seq_ids": seqs,
        "seq_slot": seqs,
        "seq_start": pos,
        "seq_end": pos + 1,
        "seq_window_start": np.zeros(batch, dtype=np.int32),
        "lookback": _lookback(model, rng, batch),
        "sample_rows": seqs,
        "is_replay": np.zeros(batch, dtype=np.int32),
        **_block_tables(model, batch, context),
    }


def prefill_step(model: V41Model, chunk: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One fresh sequence's first `chunk` tokens; only its last row is sampled."""
    rng = np.random.default_rng(seed)
    lookback = np.full((1, model.cfg.text.engram_max_ngram_size - 1), -1, dtype=np.int32)
    return {
        "token_ids": rng.integers(0, model.cfg.text.vocab_size, chunk, dtype=np.int32),
        "positions": np.arange(chunk, dtype=np.int32),
        "seq_ids": np.zeros(chunk, dtype=np.int32),
        "seq_slot": np.zeros(1, dtype=np.int32),
        "seq_start": np.zeros(1, dtype=np.int32),
        "seq_end": np.full(1, chunk, dtype=np.int32),
        "seq_window_start": np.zeros(1, dtype=np.int32),
        "lookback": lookback,
        "sample_rows": np.full(1, chunk - 1, dtype=np.int32),
        "is_replay": np.zeros(chunk, dtype=np.int32),
        **_block_tables(model, 1, chunk),
    }
