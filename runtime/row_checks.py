"""Per-row validity of a step's logits and sampled tokens: a row whose logits hold NaN or +inf, or whose
sampled id lies outside the vocabulary, fails its own request and nobody else's (-inf is a valid logit:
that token is never sampled). One check per engine path:

- plain steps (`row_causes`): the logits and the samples are read on the host;
- overlapped steps (`mark_invalid` on the device, `marked_causes` on the host): the samples stay on the
  device and feed the next step's inputs before the host sees them, so a bad row's token is replaced on
  the device by id 0 (always a valid embedding row) and the cause travels in its logprob, with no extra
  copy or sync, as a positive value, which no `sample` variant gives a row: its logprob is <= 0, or NaN
  where it is not computed ("greedy_token", ops/sampling.py): +1 for non-finite logits, +inf for an id
  outside the vocabulary;
- DSpark verify steps (`row_causes` with the emitted rows): rows past a sequence's emission hold -1.
"""

from __future__ import annotations

import numpy as np
import torch

from dsgraph.runtime.sampler import Samples

NON_FINITE = "the model's logits hold NaN or +inf"
# The causes as `mark_invalid` writes them into a bad row's logprob (module doc).
_MARK_NON_FINITE = 1.0
_MARK_OUT_OF_VOCAB = float("inf")


def out_of_vocab(token: int | None, vocab: int) -> str:
    shown = "" if token is None else f" {token}"
    return f"sampled token id{shown} is outside the vocabulary [0, {vocab})"


def _non_finite(logits: torch.Tensor) -> torch.Tensor:
    return (torch.isnan(logits) | torch.isposinf(logits)).any(dim=-1)


def row_causes(
    logits: torch.Tensor, tokens: torch.Tensor, vocab: int, emitted: np.ndarray | None = None
) -> dict[int, str]:
    """Sample row -> why it is invalid, for the rows that are. `emitted`: which rows carry a token
    (None: all); the others are only checked for their logits."""
    bad_logits = _non_finite(logits).cpu().numpy()
    ids = tokens.cpu().numpy()
    carries = np.ones(len(ids), dtype=bool) if emitted is None else emitted
    bad_ids = carries & ((ids < 0) | (ids >= vocab))
    out = {}
    for i in np.flatnonzero(bad_logits | bad_ids).tolist():
        out[i] = NON_FINITE if bad_logits[i] else out_of_vocab(int(ids[i]), vocab)
    return out


def mark_invalid(logits: torch.Tensor, s: Samples, vocab: int) -> Samples:
    """Device-side: bad rows get token 0 and their cause in the logprob (see the module doc)."""
    non_finite = _non_finite(logits)
    oov = (s.tokens < 0) | (s.tokens >= vocab)
    logprobs = torch.where(oov, torch.full_like(s.logprobs, _MARK_OUT_OF_VOCAB), s.logprobs)
    logprobs = torch.where(non_finite, torch.full_like(s.logprobs, _MARK_NON_FINITE), logprobs)
    tokens = torch.where(non_finite | oov, torch.zeros_like(s.tokens), s.tokens)
    return Samples(tokens, logprobs, s.top_logprobs, s.top_ids)


def marked_causes(host: Samples, vocab: int) -> dict[int, str]:
    """Host-side reading of `mark_invalid`'s marks: sample row -> cause."""
    lp = host.logprobs.numpy()
    out = {i: NON_FINITE for i in np.flatnonzero(lp == _MARK_NON_FINITE).tolist()}
    out.update({i: out_of_vocab(None, vocab) for i in np.flatnonzero(lp == _MARK_OUT_OF_VOCAB).tolist()})
    return out
