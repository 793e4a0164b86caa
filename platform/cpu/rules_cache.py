"""Reference meaning of swa_write, paged_write and compress (dsgraph.ops.cache), in torch."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.step_rows import (
    locate_entries,
    per_row,
    real_rows,
    require_in_range,
    require_unique,
    rowwise_linear,
)


def swa_write(
    _p: Any,
    ring: Tensor,
    entries: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    seq_slot: Tensor,
    seq_end: Tensor,
) -> Tensor:
    slots, ring_len = ring.shape[0], ring.shape[1]
    real, seq = real_rows("swa_write", seq_ids, seq_slot.shape[0])
    require_in_range(
        "swa_write", seq_slot, slots, "seq_slot", active=_used_seqs(seq, real, seq_slot.shape[0])
    )
    # Older positions of a long chunk would be overwritten by later rows of the same chunk.
    keep = real & (positions.long() >= per_row(seq_end, seq, real) - ring_len)
    rows = keep.nonzero().squeeze(1)
    slot = per_row(seq_slot, seq, real)[rows]
    index = positions.long()[rows] % ring_len
    require_unique("swa_write", slot * ring_len + index, rows, "one ring row")
    out = ring.clone()
    out[slot, index] = entries[rows]
    return out


def paged_write(
    _p: Any,
    pool: Tensor,
    entries: Tensor,
    entry_ids: Tensor,
    valid: Tensor,
    seq_ids: Tensor,
    block_table: Tensor,
) -> Tensor:
    num_blocks, block_size = pool.shape[0], pool.shape[1]
    real, seq = real_rows("paged_write", seq_ids, block_table.shape[0])
    rows = (valid & real).nonzero().squeeze(1)
    entry = entry_ids.long()[rows]
    block = locate_entries("paged_write", block_table, seq[rows], entry, rows, block_size, num_blocks)
    offset = entry % block_size
    require_unique("paged_write", block * block_size + offset, rows, "one pool row")
    out = pool.clone()
    out[block, offset] = entries[rows]
    return out


def _used_seqs(seq: Tensor, real: Tensor, num_seqs: int) -> Tensor:
    """[S] bool: sequences that own at least one real row of the step."""
    used = torch.zeros(num_seqs, dtype=torch.bool)
    used[seq[real]] = True
    return used


def _first_token(
    kv: Tensor,
    gate: Tensor,
    state: Tensor,
    positions: Tensor,
    closes: Tensor,
    start: Tensor,
    slot: Tensor,
    seq: Tensor,
) -> tuple[Tensor, Tensor]:
    """Projections (wkv, wgate) of the even-position token of each closing row's group: the previous row of
    the chunk, or the compressor state of the sequence's slot when the chunk starts at the odd position.
    `start` and `slot` are the row's seq_start and seq_slot (per_row)."""
    from_state = positions.long() == start
    rows = torch.arange(positions.shape[0])
    prev = (rows - 1).clamp_min(0)
    inside = closes & ~from_state
    broken = inside & ((rows == 0) | (seq[prev] != seq) | (positions[prev] != positions - 1))
    if bool(broken.any()):
        t = int(broken.nonzero()[0, 0])
        raise ValueError(
            f"compress: row {t} (position {int(positions[t])}) does not follow the row of position "
            f"{int(positions[t]) - 1} of its sequence; rows of a sequence must be contiguous and consecutive"
        )
    slot_state = state[slot]  # [T, 2, D]
    use_state = (closes & from_state).unsqueeze(1)
    first_kv = torch.where(use_state, slot_state[:, 0], kv[prev])
    return first_kv, torch.where(use_state, slot_state[:, 1], gate[prev])


def compress(p: Any, *operands: Tensor) -> tuple[Tensor, ...]:
    u, wkv = operands[0], operands[1]
    positions, seq_ids, seq_slot, seq_start = operands[-4:]
    real, seq = real_rows("compress", seq_ids, seq_slot.shape[0])
    kv = rowwise_linear(u, wkv)
    if p.ratio == 1:
        return torch.where(real.unsqueeze(1), kv, 0.0), real
    wgate, state = operands[2], operands[3]
    require_in_range(
        "compress", seq_slot, state.shape[0], "seq_slot", active=_used_seqs(seq, real, seq_slot.shape[0])
    )
    gate = rowwise_linear(u, wgate)
    closes = real & (positions % 2 == 1)
    slot = per_row(seq_slot, seq, real)
    start = per_row(seq_start, seq, real)
    first_kv, first_gate = _first_token(kv, gate, state, positions, closes, start, slot, seq)
    # [T, 2 tokens, D]: the same softmax-over-tokens pooling as the full-sequence reference.
    values = torch.stack((first_kv, kv), dim=1)
    # torch's f32 softmax over a non-last dim rounds by position in the tensor; f64 is batch invariant.
    weights = invariant.softmax(torch.stack((first_gate, gate), dim=1), 1)
    latent = torch.where(closes.unsqueeze(1), (values * weights).sum(dim=1), 0.0)
    return latent, closes, _open_groups(state, kv, gate, positions, real, seq, slot)


def _open_groups(
    state: Tensor, kv: Tensor, gate: Tensor, positions: Tensor, real: Tensor, seq: Tensor, slot: Tensor
) -> Tensor:
    """state' : each sequence whose last row sits at an even position keeps that row's projections; one
    whose last row closes a group gets zeros (no open group), so the state never depends on chunking."""
    following = torch.cat((seq[1:], seq.new_full((1,), -1)))
    following_real = torch.cat((real[1:], real.new_zeros(1)))
    is_last = real & ~(following_real & (following == seq))
    rows = (is_last & (positions % 2 == 0)).nonzero().squeeze(1)
    closed = (is_last & (positions % 2 == 1)).nonzero().squeeze(1)
    require_unique(
        "compress", slot[torch.cat((rows, closed))], torch.cat((rows, closed)), "one compressor state slot"
    )
    out = state.clone()
    out[slot[closed]] = 0.0
    out[slot[rows]] = torch.stack((kv[rows], gate[rows]), dim=1)
    return out


RULES: dict[str, Any] = {"swa_write": swa_write, "paged_write": paged_write, "compress": compress}
