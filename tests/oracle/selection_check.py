"""Tie-aware comparison of top-k selections (spec 11.4): equal sets, or sets that differ only by entries
whose score equals the k-th selected score."""

from __future__ import annotations

import torch

EPS = 1e-6  # relative to the largest finite score of the row


def tie_equivalent(ours: torch.Tensor, ref: torch.Tensor, scores: torch.Tensor) -> bool:
    """`ours`/`ref` [k] selected entry ids (-1 = none), `scores` [E] this row's scores (-inf invisible).

    True when both select the same number of entries, everything scoring strictly above the
    reference's k-th score is in ours, and every entry in one set only scores exactly that k-th score.
    """
    a, b = {int(i) for i in ours if i >= 0}, {int(i) for i in ref if i >= 0}
    if a == b:
        return True
    if len(a) != len(b):
        return False
    finite = scores[torch.isfinite(scores)]
    eps = EPS * float(finite.abs().max()) if finite.numel() else 0.0
    kth = min(float(scores[i]) for i in b)
    above = {int(i) for i in torch.nonzero(scores > kth + eps).flatten()}
    differ = a ^ b
    return above <= a and all(abs(float(scores[i]) - kth) <= eps for i in differ)


def block_scores(scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """Candidate-block scores of one row: max over each block, the newest visible block forced to +inf."""
    width = -(-scores.numel() // block_size) * block_size
    padded = torch.full((width,), float("-inf"))
    padded[: scores.numel()] = scores
    blocks = padded.view(-1, block_size).amax(-1)
    finite = torch.nonzero(torch.isfinite(scores)).flatten()
    if finite.numel():
        blocks[int(finite.max()) // block_size] = float("inf")
    return blocks


def candidates_tie_equivalent(
    ours: torch.Tensor, ref: torch.Tensor, scores: torch.Tensor, block_size: int
) -> bool:
    """Candidate masks [E] (bool) keeping the same blocks, or blocks that differ only by tied scores."""
    blocks = block_scores(scores, block_size)
    kept = lambda mask: {int(i) // block_size for i in torch.nonzero(mask).flatten()}  # noqa: E731
    a, b = kept(ours), kept(ref)
    pad = lambda s: torch.tensor(sorted(s) + [-1] * 0, dtype=torch.long)  # noqa: E731
    return tie_equivalent(
        pad(a),
        pad(b),
        torch.where(torch.isinf(blocks) & (blocks > 0), torch.finfo(torch.float32).max, blocks),
    )
