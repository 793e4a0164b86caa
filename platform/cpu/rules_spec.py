"""Reference meaning of `spec_verify` (dsgraph.ops.spec_sampling), in torch.

Batch invariance: every row is decided by per-row kernels along the vocabulary (the `sample` op's
processing, softmax, cumsum, searchsorted, gathers) and exact IEEE arithmetic (subtraction, clamping,
one multiplication per comparison) on the row's own inputs and its (seed, position) uniforms; only the
prefix of accepted rows is taken per sequence, over that sequence's rows. So a sequence's outcome does
not depend on the rest of the batch, its place in it, or padding rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dsgraph.ops.sampling import GREEDY_BELOW
from dsgraph.ops.spec_sampling import STREAM_ACCEPT, STREAM_RESIDUAL
from dsgraph.platform.cpu.rules_sampling import allowed_tokens, draw_rank, process, uniform_draw

__all__ = ["RULES", "spec_verify"]

_NEG_INF = float("-inf")
# f64 elements of one [rows, V] temporary: bounds memory for the real vocabulary, batches small ones.
_ELEMENTS_PER_CHUNK = 1 << 21


@dataclass(frozen=True)
class _Segments:
    row_seq: Tensor  # [outs] i64: the row's sequence, -1 for rows of none
    index: Tensor  # [outs] i64: the row's place in its sequence (j), -1 for rows of none
    is_bonus: Tensor  # [outs] bool: the last row of its sequence


def _segments(start: Tensor, length: Tensor, outs: int) -> _Segments:
    """Rows of each sequence; a row outside 0..outs-1 or owned by two sequences is an error naming them."""
    start, length = start.long(), length.long()
    bad = (length < 0) | ((length > 0) & ((start < 0) | (start + length > outs)))
    if bool(bad.any()):
        s = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"spec_verify: sequence {s} has verify_start {int(start[s])} and verify_len {int(length[s])}; "
            f"expected verify_len >= 0 and rows inside 0..{outs - 1}"
        )
    dev = start.device
    seq = torch.repeat_interleave(torch.arange(start.shape[0], device=dev), length)
    offsets = torch.cumsum(length, 0) - length
    index = torch.arange(seq.shape[0], device=dev) - offsets[seq]
    rows = start[seq] + index
    count = torch.bincount(rows, minlength=outs)
    if bool((count > 1).any()):
        r = int((count > 1).nonzero()[0, 0])
        owners = seq[rows == r].tolist()
        raise ValueError(f"spec_verify: row {r} belongs to sequences {owners}; each row to at most one")
    row_seq = torch.full((outs,), -1, dtype=torch.long, device=dev)
    row_index = torch.full((outs,), -1, dtype=torch.long, device=dev)
    row_seq[rows], row_index[rows] = seq, index
    is_bonus = torch.zeros(outs, dtype=torch.bool, device=dev)
    is_bonus[rows] = index == length[seq] - 1
    return _Segments(row_seq, row_index, is_bonus)


def _check_drafts(draft: Tensor, draft_logprobs: Tensor, temperature: Tensor, seg: _Segments) -> None:
    vocab = draft_logprobs.shape[1]
    draft_rows = (seg.row_seq >= 0) & ~seg.is_bonus
    bad = draft_rows & ((draft < 0) | (draft >= vocab))
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"spec_verify: row {r} (sequence {int(seg.row_seq[r])}, draft {int(seg.index[r])}) has "
            f"draft_token {int(draft[r])}, expected 0..{vocab - 1}"
        )
    sampled = draft_rows & (temperature >= GREEDY_BELOW)
    empty = sampled & ~(draft_logprobs > _NEG_INF).any(-1)
    if bool(empty.any()):
        r = int(empty.nonzero()[0, 0])
        raise ValueError(
            f"spec_verify: row {r} (sequence {int(seg.row_seq[r])}) samples but its draft_logprobs hold no "
            "finite value; expected the draft's log-probabilities"
        )


def _verify_rows(
    logits: Tensor,
    draft: Tensor,
    draft_logprobs: Tensor,
    params: tuple[Tensor, Tensor, Tensor, Tensor],
    u: tuple[Tensor, Tensor, Tensor],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per row: (accepts its draft, log p_t(draft), the token it emits if it stops the sequence, and that
    token's log p_t). A stopping draft row emits its rejection token, a bonus row its ordinary draw."""
    u_bonus, u_accept, u_residual = u
    d = process(logits, *params)
    n, vocab = logits.shape
    probs = torch.softmax(d.log_probs, dim=-1)  # p_t in sorted order
    vocab_ids = torch.arange(vocab, device=logits.device).expand(n, vocab)
    rank_of = torch.empty_like(d.order).scatter_(1, d.order, vocab_ids)
    draft_rank = rank_of.gather(1, draft.long().clamp(0, vocab - 1).unsqueeze(1))
    p_draft = torch.softmax(draft_logprobs.double(), dim=-1).gather(1, d.order)  # p_d in sorted order
    pt_d, pd_d = probs.gather(1, draft_rank).squeeze(1), p_draft.gather(1, draft_rank).squeeze(1)
    accept = torch.where(d.greedy, draft_rank.squeeze(1) == 0, u_accept * pd_d < pt_d)
    residual = torch.cumsum((probs - p_draft).clamp_min(0.0), dim=-1)
    total = residual[:, -1]
    # The first rank whose cumulative residual exceeds u * total: a rank with residual mass (module doc).
    from_residual = torch.searchsorted(residual, (u_residual * total).unsqueeze(1), right=True)
    rejected = torch.where(
        (total > 0).unsqueeze(1), from_residual.clamp_max(vocab - 1), draw_rank(d, u_residual)
    )
    rejected = torch.where(d.greedy.unsqueeze(1), 0, rejected)
    ranks = torch.stack((rejected.squeeze(1), draw_rank(d, u_bonus).squeeze(1)), dim=1)
    tokens = d.order.gather(1, ranks)
    logprobs = d.log_probs.gather(1, ranks)
    dead = d.finite == 0
    return (
        accept & ~dead,
        d.log_probs.gather(1, draft_rank).squeeze(1),
        torch.where(dead.unsqueeze(1), -1, tokens),
        logprobs.masked_fill(dead.unsqueeze(1), _NEG_INF),
    )


def spec_verify(
    _p: Any,
    logits: Tensor,
    draft_token: Tensor,
    draft_logprobs: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    top_k: Tensor,
    min_p: Tensor,
    seed: Tensor,
    position: Tensor,
    verify_start: Tensor,
    verify_len: Tensor,
    *allowed: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    outs, vocab = logits.shape
    seg = _segments(verify_start, verify_len, outs)
    _check_drafts(draft_token, draft_logprobs, temperature, seg)
    if allowed:
        logits = logits.masked_fill(~allowed_tokens(allowed[0], vocab), _NEG_INF)
    u = tuple(uniform_draw(seed, position, s) for s in (0, STREAM_ACCEPT, STREAM_RESIDUAL))
    rows = (logits, draft_token, draft_logprobs, temperature, top_p, top_k, min_p, *u)
    step = max(1, _ELEMENTS_PER_CHUNK // max(vocab, 1))
    parts = [
        _verify_rows(x[0], x[1], x[2], tuple(x[3:7]), tuple(x[7:10]))  # type: ignore[arg-type]
        for x in (tuple(t[i : i + step] for t in rows) for i in range(0, max(outs, 1), step))
    ]
    accept, draft_lp, stop_tokens, stop_lp = (torch.cat(p) for p in zip(*parts, strict=True))
    return _emit(seg, verify_len, draft_token, accept, draft_lp, stop_tokens, stop_lp)


def _emit(
    seg: _Segments,
    verify_len: Tensor,
    draft_token: Tensor,
    accept: Tensor,
    draft_lp: Tensor,
    stop_tokens: Tensor,
    stop_lp: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """num_accepted per sequence, then each row's emitted token (draft, stopping token or -1)."""
    owned = seg.row_seq >= 0
    stops = owned & (seg.is_bonus | ~accept)
    seqs = verify_len.shape[0]
    big = torch.iinfo(torch.long).max
    first_stop = torch.full((seqs,), big, dtype=torch.long, device=draft_token.device).scatter_reduce(
        0, seg.row_seq.clamp_min(0), torch.where(stops, seg.index, big), "amin"
    )
    num_accepted = torch.where(verify_len > 0, first_stop, -1)
    n = num_accepted[seg.row_seq.clamp_min(0)]
    is_draft = owned & (seg.index < n)
    is_stop = owned & (seg.index == n)
    which = seg.is_bonus.long().unsqueeze(1)  # column 0: rejection token, 1: bonus draw
    stop_token, stop_logprob = stop_tokens.gather(1, which).squeeze(1), stop_lp.gather(1, which).squeeze(1)
    token = torch.where(is_draft, draft_token.long(), torch.where(is_stop, stop_token, -1))
    logprob = torch.where(is_draft, draft_lp, torch.where(is_stop, stop_logprob, _NEG_INF))
    return num_accepted.int(), token.int(), logprob.float()


RULES: dict[str, Any] = {"spec_verify": spec_verify}
