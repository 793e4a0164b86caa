"""Triton kernels of the Engram ops (rules in engram.py), bit-equal to platform/cpu/rules_engram.py.

- `engram_hash_kernel`: one program per token: the max_ngram shifts' raw ids (chunk or lookback), their
  compressed ids, the sticky blocking, the int64 products and xors, and every order's heads'
  `h mod prime + offset`. All products are of non-negative values that fit int64 (the op checks it), so
  Triton's truncating `%` equals torch's flooring one.
- `gather_dequant_rows_kernel`: one program per (row id, column block): the FP8 bytes and UE8M0 scale
  bytes of one table row, decoded on the bits (the interpreter's FP8 casts are not exact), multiplied in
  FP32 and rounded once to the output dtype. The table may live in pinned host memory (a UVA address):
  each program then reads one contiguous 256-byte row over PCIe.
- `engram_gate_kernel`: one program per (token, stream): the gate's reductions over the hidden size and the
  gated residual, in the cpu rule's f32 arithmetic (reductions in another order: within f32 rounding).

Importing this module imports triton; the rule module imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_tl import e8m0_to_f32, round_f32_to


@triton.jit
def e4m3_bits_to_f32(byte: tl.tensor) -> tl.tensor:
    """E4M3 byte -> its value in FP32, exactly (0x7F/0xFF are NaN, as torch decodes them)."""
    b = byte.to(tl.int32)
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    magnitude = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormals: m * 2^-9
    # the sign goes in on the bits: the interpreter's negation turns 0.0 into +0.0, torch decodes 0x80 as -0.0
    value = (magnitude.to(tl.int32, bitcast=True) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)
    return tl.where((e == 15) & (m == 7), float("nan"), value)


@triton.jit
def gather_dequant_rows_kernel(
    table_ptr, scale_ptr, rows_ptr, out_ptr, num_table_rows,
    D: tl.constexpr, BLOCK_D: tl.constexpr, OUT: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (row ids, cdiv(D, BLOCK_D)): out[n, c] = e4m3(table[rows[n], c]) * 2^(scale[rows[n], c/32]-127).
    A row id outside [0, R) reads nothing and gives 0 (the rule checks ids first unless unchecked)."""
    pdl_tl.enter(PDL)
    n = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row = tl.load(rows_ptr + n).to(tl.int64)
    inside = (row >= 0) & (row < num_table_rows)
    mask = (cols < D) & inside
    values = tl.load(table_ptr + row * D + cols, mask=mask, other=0)
    scales = tl.load(scale_ptr + row * (D // 32) + cols // 32, mask=mask, other=127)
    out = e4m3_bits_to_f32(values) * e8m0_to_f32(scales)
    if OUT == tl.int16:  # bf16 stored as its bits: the interpreter's bf16 cast mangles subnormals
        bits = out.to(tl.int32, bitcast=True)
        rounded = tl.where(out != out, 0x7FC0, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.int16)
    else:
        rounded = round_f32_to(out, OUT)
    tl.store(out_ptr + n.to(tl.int64) * D + cols, rounded, mask=cols < D)


@triton.jit
def engram_hash_kernel(
    tok_ptr, pos_ptr, seq_ptr, start_ptr, look_ptr, map_ptr, primes_ptr, offsets_ptr, mult_ptr, out_ptr,
    num_seqs, vocab, pad_id, image_id,
    M: tl.constexpr, HEADS: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (tokens,): out[t, (n-2)*HEADS + j] for orders n = 2..M (the op's doc); 0 for padding rows."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    seq = tl.load(seq_ptr + t)
    real = seq >= 0
    sid = tl.maximum(seq, 0)
    start = tl.load(start_ptr + sid, mask=sid < num_seqs, other=0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < HEADS
    rolling = pos * 0
    blocked = pos != pos  # False, as a value the loop can update
    for s in tl.static_range(M):
        source = pos - s
        in_chunk = source >= start
        from_chunk = tl.load(tok_ptr + tl.maximum(t - s, 0)).to(tl.int64)
        back = tl.minimum(tl.maximum(start - source - 1, 0), M - 2)
        from_back = tl.load(look_ptr + sid.to(tl.int64) * (M - 1) + back, mask=sid < num_seqs, other=-1)
        raw = tl.where(in_chunk, from_chunk, from_back.to(tl.int64))
        stop = (source < 0) | (raw < 0) | ((image_id >= 0) & (raw == image_id))
        mapped = tl.load(map_ptr + tl.minimum(tl.maximum(raw, 0), vocab - 1)).to(tl.int64)
        blocked = blocked | stop | (mapped < 0)
        product = tl.where(blocked, pad_id, mapped).to(tl.int64) * tl.load(mult_ptr + s)
        rolling = rolling ^ product
        if s > 0:
            primes = tl.load(primes_ptr + (s - 1) * HEADS + heads, mask=hmask, other=1)
            offsets = tl.load(offsets_ptr + (s - 1) * HEADS + heads, mask=hmask, other=0)
            rows = tl.where(real, rolling % primes + offsets, 0)
            tl.store(out_ptr + t.to(tl.int64) * ((M - 1) * HEADS) + (s - 1) * HEADS + heads, rows, mask=hmask)


__all__ = ["e4m3_bits_to_f32", "engram_hash_kernel", "gather_dequant_rows_kernel", "tl", "triton"]


@triton.jit
def engram_gate_kernel(
    x_ptr, kv_ptr, qw_ptr, kw_ptr, tok_ptr, out_ptr, eps, inv_sqrt_h, image_token_id,
    N: tl.constexpr, H: tl.constexpr, BLOCK: tl.constexpr, OUT: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (tokens, N): stream m of token t, in the cpu rule's f32 arithmetic. Pass 1 sums x^2, K^2 and
    x * (qw * kw) * K over H in fixed BLOCK tiles (batch invariant); d = dot * (r_x * r_k) * H^-0.5 with
    r = 1/sqrt(mean + eps) (IEEE sqrt and division), g = sigmoid(copysign(sqrt(max(|d|, 1e-6)), d)) in
    f64 rounded to f32, 0 for padding and image tokens. Pass 2: out = x + g * v, one cast."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1)
    x_row = (t * N + m) * H
    kv_row = t * ((N + 1) * H)
    c = tl.arange(0, BLOCK)
    xx = tl.zeros((BLOCK,), dtype=tl.float32)
    kk = tl.zeros((BLOCK,), dtype=tl.float32)
    xk = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in tl.static_range(0, H, BLOCK):
        mask = c0 + c < H
        x = tl.load(x_ptr + x_row + c0 + c, mask=mask, other=0.0).to(tl.float32)
        k = tl.load(kv_ptr + kv_row + m * H + c0 + c, mask=mask, other=0.0)
        qw = tl.load(qw_ptr + m * H + c0 + c, mask=mask, other=0.0).to(tl.float32)
        kw = tl.load(kw_ptr + m * H + c0 + c, mask=mask, other=0.0).to(tl.float32)
        xx += x * x
        kk += k * k
        xk += x * (qw * kw) * k
    h = tl.full((), H, tl.float32)
    r_x = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(tl.sum(xx, axis=0), h) + eps))
    r_k = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(tl.sum(kk, axis=0), h) + eps))
    d = tl.sum(xk, axis=0) * (r_x * r_k) * inv_sqrt_h
    root = tl.math.sqrt_rn(tl.maximum(tl.abs(d), 1e-6))
    signed = tl.where(d.to(tl.int32, bitcast=True) < 0, -root, root)  # copysign: the sign bit, -0 too
    g = (1.0 / (1.0 + tl.exp(-signed.to(tl.float64)))).to(tl.float32)
    g = tl.where(d != d, d, g)  # NaN carried, as clamp_min, copysign and sigmoid do (then masked)
    token = tl.load(tok_ptr + t)
    g = tl.where((token < 0) | (token == image_token_id), 0.0, g)
    for c0 in tl.static_range(0, H, BLOCK):
        mask = c0 + c < H
        x = tl.load(x_ptr + x_row + c0 + c, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(kv_ptr + kv_row + N * H + c0 + c, mask=mask, other=0.0)
        tl.store(out_ptr + x_row + c0 + c, round_f32_to(x + g * v, OUT), mask=mask)
