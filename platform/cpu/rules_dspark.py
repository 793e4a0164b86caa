"""Reference meaning of the DSpark ops (dsgraph.ops.dspark): draft_attention and sampling_logprobs.

Both compute every row on its own (per-row products and f64 softmax of platform/cpu/invariant.py; the
sampling processing of rules_sampling.py), so a sequence's drafts never depend on the rest of the batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.cache_format import fp8_g32_decode
from dsgraph.platform.cpu.rules_attention import _sink_softmax
from dsgraph.platform.cpu.rules_sampling import allowed_tokens, process
from dsgraph.platform.cpu.step_rows import checking, per_row, real_rows, require_in_range

_NEG_INF = float("-inf")
_ROWS_PER_CHUNK = 16  # bounds the f64 [rows, V] temporaries, as in rules_sampling.py


def _context_keys(
    ring: Tensor, slot: Tensor, start: Tensor, first: Tensor, real: Tensor, window: int
) -> tuple[Tensor, Tensor]:
    """Context keys of every row: (keys [T, window, hd] f32, valid [T, window]), positions a-window..a-1."""
    pos = start.unsqueeze(1) - window + torch.arange(window, device=ring.device)  # [T, window], oldest first
    valid = real.unsqueeze(1) & (pos >= 0) & (pos >= first.unsqueeze(1))
    keys = fp8_g32_decode(ring[slot.unsqueeze(1), torch.remainder(pos, ring.shape[1])])
    return torch.where(valid.unsqueeze(-1), keys, 0.0), valid


def _block_keys(
    kv: Tensor, seq: Tensor, real: Tensor, num_seqs: int, block_size: int
) -> tuple[Tensor, Tensor]:
    """The kv rows of each row's own block: (keys [T, block_size, hd] f32, valid [T, block_size]).

    No host read (a CUDA graph can capture it): the block's first row and length come from scatters."""
    rows, device = kv.shape[0], kv.device
    row_ids = torch.arange(rows, device=device)
    seqs = max(num_seqs, 1)  # padding rows map to sequence 0 even in a step without sequences
    counts = torch.zeros(seqs, dtype=torch.long, device=device).scatter_add(0, seq, real.long())
    first = torch.full((seqs,), rows, dtype=torch.long, device=device)
    first = first.scatter_reduce(0, seq, torch.where(real, row_ids, rows), reduce="amin")
    offsets = torch.arange(block_size, device=device)
    valid = real.unsqueeze(1) & (offsets < counts[seq].unsqueeze(1))
    index = torch.where(valid, first[seq].unsqueeze(1) + offsets, 0)  # [T, block_size]
    if checking():
        _require_blocks(seq, real, counts, index, valid, block_size)
    keys = kv.float()[index] if rows else kv.float().new_zeros(0, block_size, kv.shape[1])
    return torch.where(valid.unsqueeze(-1), keys, 0.0), valid


def _require_blocks(
    seq: Tensor, real: Tensor, counts: Tensor, index: Tensor, valid: Tensor, block_size: int
) -> None:
    """Each sequence's rows are contiguous and at most block_size; else name the row."""
    too_long = real & (counts[seq] > block_size)
    if bool(too_long.any()):
        t = int(too_long.nonzero()[0, 0])
        raise ValueError(
            f"draft_attention: sequence {int(seq[t])} has {int(counts[seq[t]])} rows, "
            f"more than block_size {block_size}"
        )
    mixed = valid & (seq[index] != seq.unsqueeze(1))
    if bool(mixed.any()):
        t, j = (int(i) for i in mixed.nonzero()[0])
        raise ValueError(
            f"draft_attention: the block of row {t} (sequence {int(seq[t])}) is not contiguous: row "
            f"{int(index[t, j])} belongs to sequence {int(seq[index[t, j]])}"
        )


def draft_attention(
    p: Any,
    q: Tensor,
    kv: Tensor,
    ring: Tensor,
    sink: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    seq_slot: Tensor,
    seq_start: Tensor,
    seq_window_start: Tensor,
) -> Tensor:
    del positions  # the block's keys are all visible; the context is fixed by seq_start
    num_seqs = seq_slot.shape[0]
    real, seq = real_rows("draft_attention", seq_ids, num_seqs)
    slot = per_row(seq_slot, seq, real)
    require_in_range("draft_attention", slot, ring.shape[0], "ring slot of row", active=real)
    start, first = per_row(seq_start, seq, real), per_row(seq_window_start, seq, real)
    context, context_valid = _context_keys(ring, slot, start, first, real, p.window)
    block, block_valid = _block_keys(kv, seq, real, num_seqs, p.block_size)
    keys = torch.cat((context, block), dim=1)
    valid = torch.cat((context_valid, block_valid), dim=1)
    logits = invariant.matmul(q.float(), keys.transpose(1, 2)) * p.softmax_scale  # [T, nh, N]
    probs = _sink_softmax(logits, valid, sink)
    out = invariant.matmul(probs, keys)
    return torch.where(real.view(-1, 1, 1), out, 0.0).to(q.dtype)


def _processed_logprobs(
    logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, min_p: Tensor
) -> Tensor:
    """The `sample` rule's processed log-probabilities (its own `process`), scattered to vocabulary order."""
    processed = process(logits, temperature, top_p, top_k, min_p)
    out = torch.empty_like(processed.log_probs).scatter_(-1, processed.order, processed.log_probs)
    return out.masked_fill((processed.finite == 0).unsqueeze(-1), _NEG_INF).float()


def sampling_logprobs(
    _p: Any,
    logits: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    top_k: Tensor,
    min_p: Tensor,
    *allowed: Tensor,
) -> Tensor:
    if allowed:
        logits = logits.masked_fill(~allowed_tokens(allowed[0], logits.shape[-1]), _NEG_INF)
    rows = (logits, temperature, top_p, top_k, min_p)
    chunks = [
        _processed_logprobs(*(x[start : start + _ROWS_PER_CHUNK] for x in rows))
        for start in range(0, logits.shape[0], _ROWS_PER_CHUNK)
    ]
    return torch.cat(chunks) if chunks else logits.clone()


RULES: dict[str, Any] = {"draft_attention": draft_attention, "sampling_logprobs": sampling_logprobs}
