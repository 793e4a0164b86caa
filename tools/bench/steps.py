"""Step inputs for the benchmark: one prefill chunk of a fresh sequence, or a decode step of B requests
at a given context length whose caches were filled with random valid bytes (decode reads the cache
whatever it holds, so no prefill of B x context tokens is needed). The layout is the runtime's synthetic
step (`runtime/step_builder.packed_inputs`: slots 0, 1, ... and consecutive pages) with random token ids
and, for decode, a random lookback (the tokens before the new one)."""

from __future__ import annotations

import numpy as np

from dsgraph.models.deepseek_v41.model import V41Model
from dsgraph.runtime.step_builder import packed_inputs


def pages_for(model: V41Model, ratio: int, context: int) -> int:
    """Pages of one ratio that a sequence of `context` tokens may hold (rounded up: pool sizing)."""
    entries = -(-context // ratio)
    return -(-entries // model.geo.page_size)


def _random_tokens(model: V41Model, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, model.cfg.text.vocab_size, shape, dtype=np.int32)


def decode_step(model: V41Model, batch: int, context: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Request b owns slot b and its pages (consecutive, in request order); its new token sits at
    context - 1."""
    rng = np.random.default_rng(seed)
    step = packed_inputs(model, [1] * batch, batch, start=context - 1)
    step["token_ids"] = _random_tokens(model, rng, (batch,))
    step["lookback"] = _random_tokens(model, rng, (batch, model.cfg.text.engram_max_ngram_size - 1))
    return step


def prefill_step(model: V41Model, chunk: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One fresh sequence's first `chunk` tokens; only its last row is sampled."""
    rng = np.random.default_rng(seed)
    step = packed_inputs(model, [chunk], 1)
    step["token_ids"] = _random_tokens(model, rng, (chunk,))
    step["sample_rows"] = np.full(1, chunk - 1, dtype=np.int32)
    return step
