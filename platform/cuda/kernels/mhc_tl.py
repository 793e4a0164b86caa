"""Triton kernels of `hc_pre`, `hc_collapse` and `hc_expand`, and of the fused `hc_expand_pre` (mhc.py
holds the rules; hc_collapse_norm is norm_rope_tl's rms_norm_kernel with a collapse prologue).

hc_pre in one launch: `hc_pre_kernel` splits each row's n*H values into fixed SPLIT-column slices (many
programs even at batch 1, where one program per row would leave a 2 MB fn read to one SM) and writes each
slice's 2n+n^2 mixing dots and sum of squares; the row's last slice to finish adds the slices in slice
order, then computes the coefficients and all Sinkhorn iterations in registers.
The split depends on the shapes only, never on the number of rows: batch invariant. From the projection
on, the arithmetic follows platform/cpu/rules_mhc.py step by step: rsqrt as 1/sqrt with IEEE division,
the fused multiply-add, sigmoid and softmax in f64 rounded once to f32, and every sum over the n streams
accumulated sequentially (stream 0 first), as torch sums a reduced dim of a few elements. Divisions use
div_rn (a plain `/` is approximate on the GPU). The rules launch these kernels with fp-fusion off, so
products and sums round as the cpu rule rounds them.

Importing this module imports triton; mhc.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_tl import round_f32_to


@triton.jit
def _seq_sum(m: tl.tensor, axis: tl.constexpr, N: tl.constexpr, NP: tl.constexpr) -> tl.tensor:
    """Sum of the [NP, NP] tile `m` along `axis` over indices 0..N-1, added in index order from 0.0.
    Each step adds a masked single-element sum (exact), so the order is the sequential one."""
    idx = tl.arange(0, NP)
    s = tl.zeros((NP,), dtype=tl.float32)
    for i in tl.static_range(N):
        if axis == 0:
            s = s + tl.sum(tl.where((idx == i)[:, None], m, 0.0), axis=0)
        else:
            s = s + tl.sum(tl.where((idx == i)[None, :], m, 0.0), axis=1)
    return s


@triton.jit
def _sigmoid_f64(z: tl.tensor) -> tl.tensor:
    zd = z.to(tl.float64)
    return (1.0 / (1.0 + tl.exp(-zd))).to(tl.float32)


@triton.jit
def _sinkhorn(z: tl.tensor, eps, ITERS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr) -> tl.tensor:
    """[NP, NP] f32 logits (rows/cols >= N masked) -> rules_mhc.sinkhorn's matrix."""
    i = tl.arange(0, NP)
    valid = (i[:, None] < N) & (i[None, :] < N)
    zd = tl.where(valid, z, float("-inf")).to(tl.float64)
    e = tl.exp(zd - tl.max(zd, axis=1)[:, None])
    e = tl.where(valid, e, 0.0)
    total = _seq_sum_f64(e, N, NP)
    comb = (e / total[:, None]).to(tl.float32) + eps
    comb = tl.where(valid, comb, 0.0)
    comb = tl.math.div_rn(comb, _seq_sum(comb, 0, N, NP)[None, :] + eps)
    for _ in tl.static_range(ITERS - 1):
        comb = tl.math.div_rn(comb, _seq_sum(comb, 1, N, NP)[:, None] + eps)
        comb = tl.math.div_rn(comb, _seq_sum(comb, 0, N, NP)[None, :] + eps)
    return comb


@triton.jit
def _seq_sum_f64(m: tl.tensor, N: tl.constexpr, NP: tl.constexpr) -> tl.tensor:
    """Row sums of an f64 [NP, NP] tile in column order (the softmax denominators)."""
    idx = tl.arange(0, NP)
    s = tl.zeros((NP,), dtype=tl.float64)
    for j in tl.static_range(N):
        s = s + tl.sum(tl.where((idx == j)[None, :], m, 0.0), axis=1)
    return s


@triton.jit
def hc_pre_kernel(
    x_ptr, fn_ptr, part_ptr, count_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, eps, norm_eps,
    y_ptr, old_ptr, post_in_ptr, comb_in_ptr,
    K: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, SPLIT: tl.constexpr, BLOCK_K: tl.constexpr,
    N: tl.constexpr, NP: tl.constexpr, ITERS: tl.constexpr, EXPAND: tl.constexpr, OUT: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Grid (tokens, S = cdiv(K, SPLIT)): the R fn-row dots and the sum of squares of one SPLIT-column
    slice of row t, into part[t, s, 0:R] and part[t, s, R] (BLOCK_K tiles, a tree sum per slice: fixed
    order); the row's last slice to arrive (an atomic count per row, reset by it) adds the slices in
    slice order and writes pre [tokens, N], post [tokens, N] and comb [tokens, N, N]: the sums a second
    launch over the partials would add, in the same order, in one launch. EXPAND (hc_expand_pre): the
    slice's streams are first computed as hc_expand_kernel computes them, from y, the old streams and
    their post / comb, and written to x (in OUT)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    rows = tl.arange(0, RP)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((RP, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, SPLIT, BLOCK_K):
        kk = s * SPLIT + k0 + k
        if EXPAND:
            x = _expand_at(x_ptr, y_ptr, old_ptr, post_in_ptr, comb_in_ptr, t, kk, K, N, OUT)
        else:
            x = tl.load(x_ptr + t * K + kk, mask=kk < K, other=0.0).to(tl.float32)
        mask = (rows[:, None] < R) & (kk[None, :] < K)
        w = tl.load(fn_ptr + rows.to(tl.int64)[:, None] * K + kk[None, :], mask=mask, other=0.0)
        acc += w * x[None, :]
        squares += x * x
    dots = tl.where(rows == R, tl.sum(squares, axis=0), tl.sum(acc, axis=1))
    S: tl.constexpr = (K + SPLIT - 1) // SPLIT
    tl.store(part_ptr + (t * S + s) * RP + rows, dots)
    # every thread's partial is written before the count says so; the last slice's loads (.cg, from
    # L2) see them (linear_tl.store_tile's pattern; counts: platform/cuda/arrival_counts.py)
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + t, 1, sem="acq_rel", scope="gpu") == S - 1:
        _finish_row(t, part_ptr + t * S * RP, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, eps,
                    norm_eps, K, S, RP, N, NP, ITERS)  # fmt: skip
        tl.atomic_xchg(count_ptr + t, 0, sem="relaxed", scope="gpu")


@triton.jit
def _expand_at(x_ptr, y_ptr, old_ptr, post_ptr, comb_ptr, t, kk, K: tl.constexpr, N: tl.constexpr,
               OUT: tl.constexpr) -> tl.tensor:  # fmt: skip
    """The new streams at flat columns kk (stream kk // H, column kk % H) of row t, hc_expand_kernel's
    arithmetic per element, stored to x in OUT and returned as read back (f32 of the stored value)."""
    H: tl.constexpr = K // N
    mask = kk < K
    j, h = kk // H, kk % H
    y = tl.load(y_ptr + t * H + h, mask=mask, other=0.0).to(tl.float32)
    mixed = tl.zeros(kk.shape, dtype=tl.float32)
    for i in tl.static_range(N):
        c = tl.load(comb_ptr + (t * N + i) * N + j, mask=mask, other=0.0)
        x = tl.load(old_ptr + (t * N + i) * H + h, mask=mask, other=0.0).to(tl.float32)
        mixed = mixed + c * x
    update = tl.load(post_ptr + t * N + j, mask=mask, other=0.0) * y
    value = round_f32_to(update + mixed, OUT)
    tl.store(x_ptr + t * K + kk, value, mask=mask)
    return value.to(tl.float32)


@triton.jit
def _mix(part_row, rows: tl.tensor, S: tl.constexpr, RP: tl.constexpr) -> tl.tensor:
    """Sum over the S slices in slice order of the partials at `rows` (-1: padding, gives 0)."""
    acc = tl.zeros(rows.shape, dtype=tl.float32)
    for s in tl.static_range(S):
        where = part_row + s * RP + tl.maximum(rows, 0)
        acc = acc + tl.load(where, mask=rows >= 0, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _coefficient(mix: tl.tensor, r, base_ptr, rows, scale) -> tl.tensor:
    """z = base + (mix * r) * scale as one fused multiply-add in f64 (exact product), rounded once."""
    base = tl.load(base_ptr + tl.maximum(rows, 0), mask=rows >= 0, other=0.0)
    m = mix * r
    return (base.to(tl.float64) + m.to(tl.float64) * scale.to(tl.float64)).to(tl.float32)


@triton.jit
def _finish_row(
    t, part_row, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, eps, norm_eps, K: tl.constexpr,
    S: tl.constexpr, RP: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, ITERS: tl.constexpr,
):  # fmt: skip
    """Row t's partials -> its pre [N], post [N] and comb [N, N]."""
    i = tl.arange(0, NP)
    ii = tl.arange(0, NP * NP)
    pre_rows = tl.where(i < N, i, -1)
    post_rows = tl.where(i < N, N + i, -1)
    comb_rows = tl.where((ii // NP < N) & (ii % NP < N), 2 * N + (ii // NP) * N + ii % NP, -1)
    mix_pre = _mix(part_row, pre_rows, S, RP)
    mix_post = _mix(part_row, post_rows, S, RP)
    mix_comb = _mix(part_row, comb_rows, S, RP)
    squares = _mix(part_row, tl.full((NP,), 2 * N + N * N, tl.int32), S, RP)
    ms = tl.math.div_rn(squares, tl.full((NP,), K, tl.float32)) + norm_eps
    r = tl.math.div_rn(tl.full((NP,), 1.0, tl.float32), tl.math.sqrt_rn(ms))
    r_comb = tl.reshape(tl.broadcast_to(r[:, None], (NP, NP)), (NP * NP,))
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    pre = _sigmoid_f64(_coefficient(mix_pre, r, base_ptr, pre_rows, s0)) + eps
    post = 2.0 * _sigmoid_f64(_coefficient(mix_post, r, base_ptr, post_rows, s1))
    z = tl.reshape(_coefficient(mix_comb, r_comb, base_ptr, comb_rows, s2), (NP, NP))
    comb = _sinkhorn(z, eps, ITERS, N, NP)
    tl.store(pre_ptr + t * N + i, pre, mask=i < N)
    tl.store(post_ptr + t * N + i, post, mask=i < N)
    cell = i[:, None] * N + i[None, :]
    tl.store(comb_ptr + t * N * N + cell, comb, mask=(i[:, None] < N) & (i[None, :] < N))


@triton.jit
def hc_collapse_kernel(
    x_ptr,
    a_ptr,
    out_ptr,
    H,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    OUT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (tokens, cdiv(H, BLOCK)): out[t, h] = sum_i a[t, i] * x[t, i, h], products rounded, i in order."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = h < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in tl.static_range(N):
        a = tl.load(a_ptr + t * N + i)
        x = tl.load(x_ptr + (t * N + i) * H + h, mask=mask, other=0.0).to(tl.float32)
        acc = acc + a * x
    tl.store(out_ptr + t * H + h, round_f32_to(acc, OUT), mask=mask)


@triton.jit
def hc_expand_kernel(
    y_ptr,
    x_ptr,
    post_ptr,
    comb_ptr,
    out_ptr,
    H,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    OUT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (tokens, cdiv(H, BLOCK)): out[t, j] = post_j * y + sum_i comb[i, j] * x_i (i in order)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = h < H
    y = tl.load(y_ptr + t * H + h, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(N):
        mixed = tl.zeros((BLOCK,), dtype=tl.float32)
        for i in tl.static_range(N):
            c = tl.load(comb_ptr + (t * N + i) * N + j)
            x = tl.load(x_ptr + (t * N + i) * H + h, mask=mask, other=0.0).to(tl.float32)
            mixed = mixed + c * x
        update = tl.load(post_ptr + t * N + j) * y
        tl.store(out_ptr + (t * N + j) * H + h, round_f32_to(update + mixed, OUT), mask=mask)
