"""Triton kernels of `swa_write`, `paged_write` and `compress`: one program copies one row's entry bytes
into its cache row (or, for the fused `encode_*_write` ops, encodes the row's values there), or writes
nothing (padding row, a row the op skips, a target out of range); compress's
ratio-2 pooling and its state ring update are one program per row each.
Importing this module imports triton; cache.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.norm_rope_tl import inv_rms, normed
from dsgraph.platform.cuda.kernels.quant_act_tl import encode_groups
from dsgraph.platform.cuda.kernels.quant_tl import round_f32_to


@triton.jit
def swa_write_kernel(
    ring_ptr, entries_ptr, pos_ptr, seq_ptr, slot_ptr, end_ptr, num_slots, ring_len,
    ENTRY_BYTES: tl.constexpr, BLOCK: tl.constexpr, ENCODE: tl.constexpr, D: tl.constexpr,
    FMT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (rows,): row t (sequence s, position p) -> ring[seq_slot[s], p % R] when p >= seq_end[s] - R.
    ENCODE (encode_swa_write): entries_ptr holds the values [rows, D], encoded here (`_write_row`)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    seq = tl.load(seq_ptr + t)
    real = seq >= 0
    s = tl.maximum(seq, 0)
    p = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + s, mask=real, other=-1)
    end = tl.load(end_ptr + s, mask=real, other=0)
    keep = real & (p >= end - ring_len) & (slot >= 0) & (slot < num_slots)
    target = (tl.where(keep, slot, 0).to(tl.int64) * ring_len + tl.maximum(p, 0) % ring_len) * ENTRY_BYTES
    dst, row = ring_ptr + target, t.to(tl.int64)
    _write_row(dst, entries_ptr, row, keep, ENTRY_BYTES, BLOCK, ENCODE, D, FMT, GROUP, BLOCK_G)


@triton.jit
def paged_write_kernel(
    pool_ptr, entries_ptr, entry_ptr, valid_ptr, seq_ptr, table_ptr, num_blocks, block_size, table_width,
    ENTRY_BYTES: tl.constexpr, BLOCK: tl.constexpr, ENCODE: tl.constexpr, D: tl.constexpr,
    FMT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (rows,): a valid real row's entry g -> pool[block_table[s, g // bs], g % bs]. ENCODE
    (encode_paged_write): entries_ptr holds the values [rows, D], encoded here (`_write_row`)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    seq = tl.load(seq_ptr + t)
    g = tl.load(entry_ptr + t)
    inside = (seq >= 0) & (tl.load(valid_ptr + t) != 0) & (g >= 0) & (g // block_size < table_width)
    s = tl.maximum(seq, 0)
    column = tl.where(inside, g, 0) // block_size
    block = tl.load(table_ptr + s.to(tl.int64) * table_width + column, mask=inside, other=-1)
    keep = inside & (block >= 0) & (block < num_blocks)
    row = tl.where(keep, block, 0).to(tl.int64) * block_size + tl.where(keep, g, 0) % block_size
    dst = pool_ptr + row * ENTRY_BYTES
    _write_row(dst, entries_ptr, t.to(tl.int64), keep, ENTRY_BYTES, BLOCK, ENCODE, D, FMT, GROUP, BLOCK_G)


@triton.jit
def _write_row(
    dst, src_ptr, t, keep, ENTRY_BYTES: tl.constexpr, BLOCK: tl.constexpr, ENCODE: tl.constexpr,
    D: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
) -> None:  # fmt: skip
    """Row t's entry into the cache row at dst when `keep`: its bytes copied from entries [rows,
    ENTRY_BYTES], or (ENCODE) its values [rows, D] encoded in format FMT by quant_act_tl.encode_groups
    (cache_encode's kernel: the same bytes)."""
    if ENCODE:
        GROUPS: tl.constexpr = D // GROUP
        for g0 in tl.static_range(0, GROUPS, BLOCK_G):
            g = g0 + tl.arange(0, BLOCK_G)
            encode_groups(src_ptr + t * D, dst, g, keep & (g < GROUPS), D, FMT, GROUP)
    else:
        b = tl.arange(0, BLOCK)
        mask = keep & (b < ENTRY_BYTES)
        tl.store(dst + b, tl.load(src_ptr + t * ENTRY_BYTES + b, mask=mask, other=0), mask=mask)


@triton.jit
def compress_state_kernel(
    state_ptr,
    kv_ptr,
    gate_ptr,
    pos_ptr,
    seq_ptr,
    slot_ptr,
    last_ptr,
    num_seqs,
    num_slots,
    ring_len,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (rows,): a real row among its sequence's ring_len newest positions (pos > last[seq] - C,
    last: the sequence's newest position in the step) stores (kv[t], gate[t]) f32 at
    state[seq_slot[seq], pos % C] [2, D]; a slot out of range writes nothing."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    seq_id = tl.load(seq_ptr + t)
    s = tl.minimum(tl.maximum(seq_id, 0), tl.maximum(num_seqs - 1, 0))
    real = (seq_id >= 0) & (num_seqs > 0)
    slot = tl.load(slot_ptr + s, mask=real, other=-1)
    p = tl.load(pos_ptr + t)
    last = tl.load(last_ptr + s, mask=real, other=0)
    keep = real & (p > last - ring_len) & (slot >= 0) & (slot < num_slots)
    p = tl.maximum(p, 0)
    target = (tl.where(keep, slot, 0).to(tl.int64) * ring_len + p % ring_len) * (2 * WIDTH)
    d = tl.arange(0, BLOCK)
    mask = keep & (d < WIDTH)
    row = t.to(tl.int64) * WIDTH + d
    tl.store(state_ptr + target + d, tl.load(kv_ptr + row, mask=mask, other=0.0), mask=mask)
    tl.store(state_ptr + target + WIDTH + d, tl.load(gate_ptr + row, mask=mask, other=0.0), mask=mask)


@triton.jit
def compress_pool_kernel(
    latent_ptr,
    closes_ptr,
    last_ptr,
    kv_ptr,
    gate_ptr,
    state_ptr,
    pos_ptr,
    seq_ptr,
    slot_ptr,
    start_ptr,
    num_seqs,
    num_slots,
    ring_len,
    norm_w_ptr,
    normed_ptr,
    eps,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    NORM_BLOCK: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """Grid (rows,): ratio-2 pooling of row t. A real row at an odd position closes its group: its first
    token is the previous row's (kv, gate), or the ring entry of position - 1 when the chunk starts at
    the row's position; latent = first_kv * w0 + kv * w1 with (w0, w1) the softmax of the two gates in
    f64, rounded to f32 (the cpu rule's invariant.softmax), products and sum in f32. Rows that do not
    close write zeros. The ring is only read here (its update is compress_state_kernel's, after, which
    reads last [S] i32: each sequence's newest position, an atomic max over its real rows from -1).
    NORM_BLOCK > 0 (compress_norm): normed[t] = rms_norm of the stored latent row by norm_w (`_norm_row`)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    seq_id = tl.load(seq_ptr + t)
    s = tl.minimum(tl.maximum(seq_id, 0), tl.maximum(num_seqs - 1, 0))
    real = (seq_id >= 0) & (num_seqs > 0)
    pos = tl.load(pos_ptr + t)
    tl.atomic_max(last_ptr + s, pos, mask=real, sem="relaxed")
    closes = real & (pos % 2 != 0)
    slot = tl.where(real, tl.load(slot_ptr + s, mask=real, other=0), 0)
    start = tl.where(real, tl.load(start_ptr + s, mask=real, other=0), 0)
    from_state = closes & (pos == start)
    ring_ok = from_state & (slot >= 0) & (slot < num_slots)  # unchecked, a bad slot reads zeros
    prev = tl.maximum(t - 1, 0).to(tl.int64)
    d = tl.arange(0, BLOCK)
    mask = closes & (d < WIDTH)
    ring_row = tl.where(ring_ok, slot, 0).to(tl.int64) * ring_len + tl.maximum(pos - 1, 0) % ring_len
    entry = ring_row * (2 * WIDTH)
    row = t.to(tl.int64) * WIDTH + d
    kv = tl.load(kv_ptr + row, mask=mask, other=0.0)
    gate = tl.load(gate_ptr + row, mask=mask, other=0.0)
    ring_kv = tl.load(state_ptr + entry + d, mask=mask & ring_ok, other=0.0)
    ring_gate = tl.load(state_ptr + entry + WIDTH + d, mask=mask & ring_ok, other=0.0)
    first_kv = tl.where(from_state, ring_kv, tl.load(kv_ptr + prev * WIDTH + d, mask=mask, other=0.0))
    first_gate = tl.where(from_state, ring_gate, tl.load(gate_ptr + prev * WIDTH + d, mask=mask, other=0.0))
    a, b = first_gate.to(tl.float64), gate.to(tl.float64)
    top = tl.maximum(a, b)
    ea, eb = tl.exp(a - top), tl.exp(b - top)
    total = ea + eb
    w0, w1 = (ea / total).to(tl.float32), (eb / total).to(tl.float32)
    latent = tl.where(closes, first_kv * w0 + kv * w1, 0.0)
    tl.store(latent_ptr + row, round_f32_to(latent, latent_ptr.dtype.element_ty), mask=d < WIDTH)
    tl.store(closes_ptr + t, closes.to(tl.uint8))
    if NORM_BLOCK > 0:
        _norm_row(latent_ptr, norm_w_ptr, normed_ptr, t, eps, WIDTH, NORM_BLOCK)


@triton.jit
def compress_rows_kernel(
    latent_ptr,
    closes_ptr,
    kv_ptr,
    seq_ptr,
    norm_w_ptr,
    normed_ptr,
    eps,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    NORM_BLOCK: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """Grid (rows,): ratio 1's outputs from the f32 projection kv: latent = kv rounded to latent's dtype
    on a real row, 0 on a padding row; closes = real. NORM_BLOCK > 0 (compress_norm): normed[t] = rms_norm
    of the stored latent row by norm_w (`_norm_row`)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    real = tl.load(seq_ptr + t) >= 0
    d = tl.arange(0, BLOCK)
    row = t.to(tl.int64) * WIDTH + d
    kv = tl.load(kv_ptr + row, mask=real & (d < WIDTH), other=0.0)
    tl.store(latent_ptr + row, round_f32_to(kv, latent_ptr.dtype.element_ty), mask=d < WIDTH)
    tl.store(closes_ptr + t, real.to(tl.uint8))
    if NORM_BLOCK > 0:
        _norm_row(latent_ptr, norm_w_ptr, normed_ptr, t, eps, WIDTH, NORM_BLOCK)


@triton.jit
def _norm_row(latent_ptr, w_ptr, out_ptr, t, eps, WIDTH: tl.constexpr, NORM_BLOCK: tl.constexpr) -> None:
    """out[t] = rms_norm_kernel's output for row t of the latent as this program stored it: its helpers
    on its tiles (NORM_BLOCK = its BLOCK for WIDTH), read back from memory as it reads them, so its bits
    (compress_norm: one launch for compress and the compressor's norm)."""
    tl.debug_barrier()  # the row's stores, by every thread of this program, are seen by the reads below
    OUT: tl.constexpr = latent_ptr.dtype.element_ty
    row = t.to(tl.int64)
    r = inv_rms(latent_ptr, latent_ptr, row, eps, WIDTH, 0, NORM_BLOCK, OUT)
    c = tl.arange(0, NORM_BLOCK)
    for c0 in tl.static_range(0, WIDTH, NORM_BLOCK):
        mask = c0 + c < WIDTH
        y = normed(latent_ptr, w_ptr, row * WIDTH + c0 + c, c0 + c, mask, r, OUT)
        tl.store(out_ptr + row * WIDTH + c0 + c, y, mask=mask)
