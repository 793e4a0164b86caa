"""Reference meaning of index_scores, candidate_mask, topk_select and attention (dsgraph.ops.attention).

Every row is computed on its own (per-row products and softmax of platform/cpu/invariant.py, not
torch.bmm, whose rounding depends on the batch count), so a sequence gives bit-identical results
whatever else shares the step and however its rows are split into steps, as long as the caches agree.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.rules_quant import decode_entries
from dsgraph.platform.cpu.step_rows import checking, locate_entries, per_row, real_rows, require_in_range

NEG_INF = float("-inf")


def _sequence_entries(block_table: Tensor, pool: Tensor, seq: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """Every entry slot of each row's sequence: (entries [T, nb*bs, B] u8, allocated [T, nb*bs] bool)."""
    num_blocks, block_size = pool.shape[0], pool.shape[1]
    if block_table.shape[0] == 0:
        block_table = block_table.new_full((1, block_table.shape[1]), -1)
    blocks = block_table.long()[seq]  # [T, nb]
    allocated = real.unsqueeze(1) & (blocks >= 0)
    bad = allocated & (blocks >= num_blocks)
    if checking() and bool(bad.any()):
        t, column = (int(i) for i in bad.nonzero()[0])
        raise IndexError(
            f"index_scores: row {t} (sequence {int(seq[t])}) has block_table[{int(seq[t])}, {column}] = "
            f"{int(blocks[t, column])}, past the pool of {num_blocks} blocks"
        )
    entries = pool[torch.where(allocated, blocks, 0)]  # [T, nb, bs, B]
    return entries.flatten(1, 2), allocated.repeat_interleave(block_size, dim=1)


def index_scores(
    p: Any, q: Tensor, w: Tensor, keys: Tensor, block_table: Tensor, positions: Tensor, seq_ids: Tensor
) -> Tensor:
    real, seq = real_rows("index_scores", seq_ids, block_table.shape[0])
    entries, allocated = _sequence_entries(block_table, keys, seq, real)
    k = decode_entries(p.key_fmt, entries)  # [T, E, id]
    dots = invariant.matmul(q, k.transpose(1, 2))  # [T, ih, E]
    scores = (dots.relu() * w.float().unsqueeze(-1)).sum(dim=1)
    entry = torch.arange(scores.shape[1], device=scores.device)
    visible = allocated & (entry.unsqueeze(0) < (positions.long().unsqueeze(1) + 1) // p.ratio)
    return torch.where(visible, scores, NEG_INF)


def _descending_order(scores: Tensor) -> Tensor:
    """Indices ordering each row by descending score; equal scores keep ascending index order."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices


def _newest(visible: Tensor) -> Tensor:
    """Per row, the largest index of a visible entry, or -1 (argmax gives the first of equal maxima; no
    [rows, E] int64 temporary: 34 GB at a 64k-token chunk)."""
    rows, width = visible.shape
    if width == 0:
        return torch.full((rows,), -1, dtype=torch.long, device=visible.device)
    last = width - 1 - visible.flip(1).to(torch.uint8).argmax(dim=1)
    return torch.where(visible.any(dim=1), last, -1)


def candidate_block_scores(p: Any, scores: Tensor) -> tuple[Tensor, Tensor]:
    """(block scores [rows, blocks] with the newest visible entry's block forced to +inf, visible
    entries [rows, E]): what candidate_mask selects its top blocks from."""
    rows, width = scores.shape
    visible = scores > NEG_INF
    num_blocks = -(-width // p.block_size)
    padded = F.pad(scores, (0, num_blocks * p.block_size - width), value=NEG_INF)
    block_scores = padded.unflatten(1, (num_blocks, p.block_size)).amax(dim=-1)
    newest = _newest(visible)
    newest_block = torch.div(newest, p.block_size, rounding_mode="floor")
    block_ids = torch.arange(num_blocks, device=scores.device)
    forced = (block_ids.unsqueeze(0) == newest_block.unsqueeze(1)) & (newest >= 0).unsqueeze(1)
    return torch.where(forced, float("inf"), block_scores), visible


def candidate_mask(p: Any, scores: Tensor) -> Tensor:
    block_scores, visible = candidate_block_scores(p, scores)
    rows, num_blocks = block_scores.shape
    best = _descending_order(block_scores)[:, : p.topk_blocks]
    keep = torch.zeros(rows, num_blocks, dtype=torch.bool, device=scores.device)
    keep.scatter_(1, best, block_scores.gather(1, best) > NEG_INF)
    return keep.repeat_interleave(p.block_size, dim=1)[:, : scores.shape[1]] & visible


def topk_select(p: Any, scores: Tensor) -> Tensor:
    rows, width = scores.shape
    best = _descending_order(scores)[:, : p.k]
    chosen = scores.gather(1, best) > NEG_INF
    # Absent slots sort after every entry index, then become -1.
    ordered = torch.where(chosen, best, width).sort(dim=1).values
    ordered = torch.where(ordered < width, ordered, -1).to(torch.int32)
    return F.pad(ordered, (0, p.k - ordered.shape[1]), value=-1)


def _swa_keys(
    kv: Tensor,
    ring: Tensor,
    positions: Tensor,
    seq: Tensor,
    real: Tensor,
    start: Tensor,
    first: Tensor,
    slot: Tensor,
    window: int,
    fmt: str = "fp8_g32",
) -> tuple[Tensor, Tensor]:
    """SWA keys of every row: (keys [T, window, hd] f32, valid [T, window] bool), oldest position first.

    Position pos = p - window + 1 + j comes from kv row t - (p - pos) when pos >= seq_start (this chunk),
    else from the ring entry ring[slot, pos % R] written by an earlier step. Positions below the row's
    `first` (seq_window_start) are not keys: the ring holds nothing of this request there.
    """
    rows = positions.shape[0]
    # distance from the query position, oldest first
    back = torch.arange(window - 1, -1, -1, device=positions.device)
    pos = positions.long().unsqueeze(1) - back  # [T, window]
    valid = real.unsqueeze(1) & (pos >= 0) & (pos >= first.long().unsqueeze(1))
    in_chunk = pos >= start.unsqueeze(1)
    chunk_row = (torch.arange(rows, device=positions.device).unsqueeze(1) - back).clamp(0, max(rows - 1, 0))
    wrong = valid & in_chunk & ((positions.long()[chunk_row] != pos) | (seq[chunk_row] != seq.unsqueeze(1)))
    if checking() and bool(wrong.any()):
        t, j = (int(i) for i in wrong.nonzero()[0])
        raise ValueError(
            f"attention: row {t} needs position {int(pos[t, j])} of its chunk (seq_start {int(start[t])}) "
            f"at row "
            f"{t - window + 1 + j}, which holds another position or sequence; rows must be contiguous"
        )
    from_chunk = kv.float()[chunk_row] if rows else kv.float().new_zeros(0, window, kv.shape[1])
    from_ring = decode_entries(fmt, ring[slot.unsqueeze(1), torch.remainder(pos, ring.shape[1])])
    keys = torch.where(in_chunk.unsqueeze(-1), from_chunk, from_ring)
    return torch.where(valid.unsqueeze(-1), keys, 0.0), valid


def _compressed_keys(
    pool: Tensor, block_table: Tensor, topk: Tensor, seq: Tensor, real: Tensor, fmt: str = "nvfp4_g16"
) -> tuple[Tensor, Tensor]:
    """Selected compressed entries of every row: (keys [T, K, hd] f32, valid [T, K] bool)."""
    num_blocks, block_size = pool.shape[0], pool.shape[1]
    valid = real.unsqueeze(1) & (topk >= 0)
    if not checking():  # fixed shapes, no host read (capturable): invalid slots read entry 0 and are masked
        return _compressed_keys_unchecked(pool, block_table, topk, seq, valid, fmt)
    row, column = valid.nonzero(as_tuple=True)
    entry = topk.long()[row, column]
    block = locate_entries("attention", block_table, seq[row], entry, row, block_size, num_blocks)
    keys = torch.zeros(*topk.shape, pool.shape[2], dtype=torch.uint8, device=pool.device)
    keys[row, column] = pool[block, entry % block_size]
    return torch.where(valid.unsqueeze(-1), decode_entries(fmt, keys), 0.0), valid


def _compressed_keys_unchecked(
    pool: Tensor, block_table: Tensor, topk: Tensor, seq: Tensor, valid: Tensor, fmt: str
) -> tuple[Tensor, Tensor]:
    num_blocks, block_size = pool.shape[0], pool.shape[1]
    if block_table.shape[0] == 0 or block_table.shape[1] == 0:
        block_table = block_table.new_full((1, max(block_table.shape[1], 1)), -1)
    entry = topk.long().clamp_min(0)
    column = torch.div(entry, block_size, rounding_mode="floor").clamp(max=block_table.shape[1] - 1)
    block = block_table.long()[seq].gather(1, column)  # [T, K]
    valid = valid & (block >= 0) & (block < num_blocks)
    keys = pool[block.clamp(0, num_blocks - 1), entry % block_size]
    return torch.where(valid.unsqueeze(-1), decode_entries(fmt, keys), 0.0), valid


def _sink_softmax(logits: Tensor, valid: Tensor, sink: Tensor) -> Tensor:
    """P [T, nh, N]: softmax over the valid keys with exp(sink_h) as one more term of the denominator."""
    masked = torch.where(valid.unsqueeze(1), logits, NEG_INF)
    sink_column = sink.float().view(1, -1, 1).expand(logits.shape[0], -1, 1)
    return invariant.softmax(torch.cat((masked, sink_column), dim=-1), -1)[..., :-1]


def attention(p: Any, q: Tensor, kv: Tensor, ring: Tensor, sink: Tensor, *operands: Tensor) -> Tensor:
    positions, seq_ids, seq_slot, seq_start, seq_window_start = operands[:5]
    real, seq = real_rows("attention", seq_ids, seq_slot.shape[0])
    require_in_range(
        "attention", per_row(seq_slot, seq, real), ring.shape[0], "ring slot of row", active=real
    )
    start, slot = per_row(seq_start, seq, real), per_row(seq_slot, seq, real)
    first = per_row(seq_window_start, seq, real)
    keys, valid = _swa_keys(kv, ring, positions, seq, real, start, first, slot, p.window, p.ring_fmt)
    if len(operands) == 8:
        pool, block_table, topk = operands[5:]
        extra_keys, extra_valid = _compressed_keys(pool, block_table, topk, seq, real, p.pool_fmt)
        keys, valid = torch.cat((keys, extra_keys), dim=1), torch.cat((valid, extra_valid), dim=1)
    logits = invariant.matmul(q, keys.transpose(1, 2)) * p.softmax_scale  # [T, nh, N]
    probs = _sink_softmax(logits, valid, sink)
    out = invariant.matmul(probs, keys)  # [T, nh, hd]
    return torch.where(real.view(-1, 1, 1), out, 0.0).to(q.dtype)


RULES: dict[str, Any] = {
    "index_scores": index_scores,
    "candidate_mask": candidate_mask,
    "topk_select": topk_select,
    "attention": attention,
}
