"""Triton kernels of `swa_write` and `paged_write`: one program copies one row's entry bytes into its
cache row, or writes nothing (padding row, a row the op skips, a target out of range).
Importing this module imports triton; cache.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def swa_write_kernel(
    ring_ptr,
    entries_ptr,
    pos_ptr,
    seq_ptr,
    slot_ptr,
    end_ptr,
    num_slots,
    ring_len,
    ENTRY_BYTES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (rows,): row t (sequence s, position p) -> ring[seq_slot[s], p % R] when p >= seq_end[s] - R."""
    t = tl.program_id(0)
    seq = tl.load(seq_ptr + t)
    real = seq >= 0
    s = tl.maximum(seq, 0)
    p = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + s, mask=real, other=-1)
    end = tl.load(end_ptr + s, mask=real, other=0)
    keep = real & (p >= end - ring_len) & (slot >= 0) & (slot < num_slots)
    target = (tl.where(keep, slot, 0).to(tl.int64) * ring_len + tl.maximum(p, 0) % ring_len) * ENTRY_BYTES
    b = tl.arange(0, BLOCK)
    mask = keep & (b < ENTRY_BYTES)
    data = tl.load(entries_ptr + t.to(tl.int64) * ENTRY_BYTES + b, mask=mask, other=0)
    tl.store(ring_ptr + target + b, data, mask=mask)


@triton.jit
def paged_write_kernel(
    pool_ptr,
    entries_ptr,
    entry_ptr,
    valid_ptr,
    seq_ptr,
    table_ptr,
    num_blocks,
    block_size,
    table_width,
    ENTRY_BYTES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (rows,): a valid real row's entry g -> pool[block_table[s, g // bs], g % bs]."""
    t = tl.program_id(0)
    seq = tl.load(seq_ptr + t)
    g = tl.load(entry_ptr + t)
    inside = (seq >= 0) & (tl.load(valid_ptr + t) != 0) & (g >= 0) & (g // block_size < table_width)
    s = tl.maximum(seq, 0)
    column = tl.where(inside, g, 0) // block_size
    block = tl.load(table_ptr + s.to(tl.int64) * table_width + column, mask=inside, other=-1)
    keep = inside & (block >= 0) & (block < num_blocks)
    row = tl.where(keep, block, 0).to(tl.int64) * block_size + tl.where(keep, g, 0) % block_size
    b = tl.arange(0, BLOCK)
    mask = keep & (b < ENTRY_BYTES)
    data = tl.load(entries_ptr + t.to(tl.int64) * ENTRY_BYTES + b, mask=mask, other=0)
    tl.store(pool_ptr + row * ENTRY_BYTES + b, data, mask=mask)


@triton.jit
def compress_state_kernel(
    state_ptr,
    kv_ptr,
    gate_ptr,
    write_ptr,
    pos_ptr,
    slot_ptr,
    num_slots,
    ring_len,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (rows,): a row with write[t] stores (kv[t], gate[t]) f32 at state[slot[t], pos % C] [2, D]."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    keep = (tl.load(write_ptr + t) != 0) & (slot >= 0) & (slot < num_slots)
    p = tl.maximum(tl.load(pos_ptr + t), 0)
    target = (tl.where(keep, slot, 0).to(tl.int64) * ring_len + p % ring_len) * (2 * WIDTH)
    d = tl.arange(0, BLOCK)
    mask = keep & (d < WIDTH)
    row = t.to(tl.int64) * WIDTH + d
    tl.store(state_ptr + target + d, tl.load(kv_ptr + row, mask=mask, other=0.0), mask=mask)
    tl.store(state_ptr + target + WIDTH + d, tl.load(gate_ptr + row, mask=mask, other=0.0), mask=mask)
