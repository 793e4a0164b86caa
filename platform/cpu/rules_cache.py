"""Reference meaning of swa_write, paged_write and compress (dsgraph.ops.cache), in torch.

The rules are functional (they return new caches). The `*_into` variants compute the same values but
write them into their cache operand and return it: the cuda platform runs those on persistent buffers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.step_rows import (
    checking,
    locate_entries,
    per_row,
    real_rows,
    require_in_range,
    require_unique,
    rowwise_linear,
    scatter_rows,
)


def swa_write(p: Any, ring: Tensor, *operands: Tensor) -> Tensor:
    return swa_write_into(p, ring.clone(), *operands)


def swa_write_into(
    _p: Any,
    ring: Tensor,
    entries: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    seq_slot: Tensor,
    seq_end: Tensor,
) -> Tensor:
    if checking():
        check_swa_write(ring, positions, seq_ids, seq_slot, seq_end)
    slots, ring_len = ring.shape[0], ring.shape[1]
    real, seq = real_rows("swa_write", seq_ids, seq_slot.shape[0])
    # writes with fixed shapes and no host read (capturable); the checks above make the targets valid
    target = per_row(seq_slot, seq, real) * ring_len + positions.long() % ring_len
    scatter_rows(
        ring.view(slots * ring_len, -1),
        target,
        entries,
        _ring_rows_kept(ring_len, positions, seq_end, seq, real),
    )
    return ring


def _ring_rows_kept(ring_len: int, positions: Tensor, seq_end: Tensor, seq: Tensor, real: Tensor) -> Tensor:
    """Rows whose key survives the chunk: older positions of a long chunk would be overwritten by later
    rows of the same chunk, so only each sequence's last ring_len positions are written."""
    return real & (positions.long() >= per_row(seq_end, seq, real) - ring_len)


def check_swa_write(
    ring: Tensor, positions: Tensor, seq_ids: Tensor, seq_slot: Tensor, seq_end: Tensor
) -> None:
    """swa_write's host-side checks (shared with the cuda rule): every used slot in range, no two kept
    rows on one ring row. Errors name the row."""
    slots, ring_len = ring.shape[0], ring.shape[1]
    real, seq = real_rows("swa_write", seq_ids, seq_slot.shape[0])
    require_in_range(
        "swa_write", seq_slot, slots, "seq_slot", active=_used_seqs(seq, real, seq_slot.shape[0])
    )
    rows = _ring_rows_kept(ring_len, positions, seq_end, seq, real).nonzero().squeeze(1)
    slot = per_row(seq_slot, seq, real)[rows]
    require_unique("swa_write", slot * ring_len + positions.long()[rows] % ring_len, rows, "one ring row")


def paged_write(p: Any, pool: Tensor, *operands: Tensor) -> Tensor:
    return paged_write_into(p, pool.clone(), *operands)


def paged_write_into(
    _p: Any,
    pool: Tensor,
    entries: Tensor,
    entry_ids: Tensor,
    valid: Tensor,
    seq_ids: Tensor,
    block_table: Tensor,
) -> Tensor:
    if checking():
        check_paged_write(pool, entry_ids, valid, seq_ids, block_table)
    real, seq = real_rows("paged_write", seq_ids, block_table.shape[0])
    # writes with fixed shapes and no host read (capturable); the checks above make the targets valid
    _scatter_entries(pool, entries, entry_ids.long(), valid & real, seq, block_table)
    return pool


def check_paged_write(
    pool: Tensor, entry_ids: Tensor, valid: Tensor, seq_ids: Tensor, block_table: Tensor
) -> None:
    """paged_write's host-side checks (shared with the cuda rule): every written entry in an allocated
    block, no two rows on one pool row. Errors name the row and entry."""
    num_blocks, block_size = pool.shape[0], pool.shape[1]
    real, seq = real_rows("paged_write", seq_ids, block_table.shape[0])
    rows = (valid & real).nonzero().squeeze(1)
    entry = entry_ids.long()[rows]
    block = locate_entries("paged_write", block_table, seq[rows], entry, rows, block_size, num_blocks)
    require_unique("paged_write", block * block_size + entry % block_size, rows, "one pool row")


def _scatter_entries(
    pool: Tensor, entries: Tensor, entry: Tensor, write: Tensor, seq: Tensor, block_table: Tensor
) -> None:
    """paged_write's writes by `scatter_rows`; a row whose entry is outside its allocated blocks writes
    nothing (the checked path raises for it)."""
    num_blocks, block_size, width = pool.shape[0], pool.shape[1], block_table.shape[1]
    if block_table.shape[0] == 0 or width == 0:
        return
    column = torch.div(entry, block_size, rounding_mode="floor")
    inside = (entry >= 0) & (column < width)
    block = torch.where(inside, block_table[seq, column.clamp(0, width - 1)].long(), -1)
    write = write & (block >= 0) & (block < num_blocks)
    target = block.clamp_min(0) * block_size + entry.clamp_min(0) % block_size
    scatter_rows(pool.view(num_blocks * block_size, -1), target, entries, write)


def _used_seqs(seq: Tensor, real: Tensor, num_seqs: int) -> Tensor:
    """[S] bool: sequences that own at least one real row of the step."""
    used = torch.zeros(num_seqs, dtype=torch.int32, device=seq.device)
    if not seq.numel() or not num_seqs:  # no rows, or only padding rows of a step without sequences
        return used.bool()
    # a max over rows, not a masked index: no data-dependent shape (capturable)
    return used.scatter_reduce(0, seq, real.int(), "amax").bool()


def check_closing_rows(positions: Tensor, closes: Tensor, start: Tensor, seq: Tensor) -> None:
    """A closing row whose group's first token is in the chunk (position > its seq_start) follows the row
    of position - 1 of its sequence; else a ValueError naming the row (shared with the cuda rule)."""
    rows = torch.arange(positions.shape[0], device=positions.device)
    prev = (rows - 1).clamp_min(0)
    inside = closes & (positions.long() != start)
    broken = inside & ((rows == 0) | (seq[prev] != seq) | (positions[prev] != positions - 1))
    if bool(broken.any()):
        t = int(broken.nonzero()[0, 0])
        raise ValueError(
            f"compress: row {t} (position {int(positions[t])}) does not follow the row of position "
            f"{int(positions[t]) - 1} of its sequence; rows of a sequence must be contiguous and consecutive"
        )


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
    the chunk, or that position's entry of the slot's state ring when the chunk starts at the odd position.
    `start` and `slot` are the row's seq_start and seq_slot (per_row)."""
    from_state = positions.long() == start
    prev = (torch.arange(positions.shape[0], device=positions.device) - 1).clamp_min(0)
    if checking():
        check_closing_rows(positions, closes, start, seq)
    slot_state = state[slot, (positions.long() - 1) % state.shape[1]]  # [T, 2, D]
    use_state = (closes & from_state).unsqueeze(1)
    first_kv = torch.where(use_state, slot_state[:, 0], kv[prev])
    return first_kv, torch.where(use_state, slot_state[:, 1], gate[prev])


def compress(p: Any, *operands: Tensor) -> tuple[Tensor, ...]:
    if p.ratio == 2:  # operand 3 is the compressor state, returned updated
        operands = (*operands[:3], operands[3].clone(), *operands[4:])
    return compress_into(p, *operands)


def compress_into(p: Any, *operands: Tensor) -> tuple[Tensor, ...]:
    u, wkv = operands[0], operands[1]
    positions, seq_ids, seq_slot, seq_start = operands[-4:]
    real, seq = real_rows("compress", seq_ids, seq_slot.shape[0])
    out = to_torch(p.out_dtype)
    kv = rowwise_linear(u, wkv)
    if p.ratio == 1:
        return torch.where(real.unsqueeze(1), kv, 0.0).to(out), real
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
    latent = torch.where(closes.unsqueeze(1), (values * weights).sum(dim=1), 0.0).to(out)
    return latent, closes, _write_ring(state, kv, gate, positions, real, seq, slot, seq_slot.shape[0])


def _write_ring(
    state: Tensor,
    kv: Tensor,
    gate: Tensor,
    positions: Tensor,
    real: Tensor,
    seq: Tensor,
    slot: Tensor,
    num_seqs: int,
) -> Tensor:
    """state' (written into `state` [slots, C, 2, D]): the projections of each sequence's last C rows at
    [slot, position % C]. An entry holds the newest position written there, so after a chunk ending at e
    the entries of positions e-C .. e-1 do not depend on chunking, and rows rolled back (positions >= the
    committed length c, fewer than C of them) never overwrite position c-1, the one a later step reads."""
    ring, pos = state.shape[1], positions.long()
    last = torch.full((max(num_seqs, 1),), -1, dtype=torch.long, device=pos.device)
    if not checking():  # the same writes without a host read (capturable); padding rows add -1
        last = last.scatter_reduce(0, seq, torch.where(real, pos, -1), "amax")
        write = real & (pos > last[seq] - ring)
        values = torch.stack((kv, gate), dim=1).flatten(1)
        scatter_rows(state.view(state.shape[0] * ring, -1), slot * ring + pos % ring, values, write)
        return state
    last = last.scatter_reduce(0, seq[real], pos[real], "amax")
    rows = (real & (pos > last[seq] - ring)).nonzero().squeeze(1)
    index = pos[rows] % ring
    require_unique("compress", slot[rows] * ring + index, rows, "one compressor state ring row")
    state[slot[rows], index] = torch.stack((kv[rows], gate[rows]), dim=1)
    return state


RULES: dict[str, Any] = {"swa_write": swa_write, "paged_write": paged_write, "compress": compress}
INPLACE_RULES: dict[str, Any] = {
    "swa_write": swa_write_into,
    "paged_write": paged_write_into,
    "compress": compress_into,
}
