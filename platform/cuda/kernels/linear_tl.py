"""The Triton kernel behind `linear` and `grouped_linear` over dense weights, and the chunk dot the MoE
kernels share (rules in linear.py, which imports this lazily; FP8 weights run linear_bf16_tl.py).

One program computes a [BLOCK_M, BLOCK_N] tile of group g: `out[m, g, n] = sum_k x[m, g, k] * W[g*N + n, k]`.
K is walked in 32-column chunks, the size of both scale blocks (weight UE8M0 32x32, activation FP8-g32):
each chunk is one tensor-core dot with a fresh FP32 accumulator, multiplied by its scales and added to
the FP32 tile accumulator. Promoting every 32 columns also bounds the error of Hopper's FP8 tensor cores,
whose internal accumulation keeps only ~14 mantissa bits. A pipeline step loads BLOCK_K / 32 chunks
(more bytes in flight per step) but still adds them one at a time in increasing K order, so a row's
result depends only on that row and the weights (batch invariance), whatever tiles linear.py picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.arrival_counts import arrival_counts
from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_tl import e8m0_to_f32, fp8_g32_quantize, round_f32_to

# DOT_KIND: the operand type of the tensor-core dot.
DOT_FP8 = 0  # x FP8-g32 quantized in the kernel, FP8 weights: E4M3 x E4M3
DOT_NATIVE = 1  # x in bf16/f16, weight converted to x's dtype (E4M3 values are exact in both)
DOT_F32 = 2  # FP32 operands, IEEE FMA products (f32 activations with dense or mixed-dtype weights)
# f32 x against a weight whose values are exact in bf16 (FP8, FP4): x = hi + mid + lo exactly, three bf16
# pieces of 8 significant bits each, so three bf16 tensor-core dots give exact products summed in FP32.
DOT_SPLIT = 3
DOT_SPLIT_F32 = 4  # the same pieces dotted as FP32 (Triton's interpreter, whose bf16 dot is broken)
# Triton's interpreter only: the chunk's products summed in FP64 and rounded once. Its FP32 dot sums in
# an order that depends on the tile shape, which would make rows depend on the batch's tiles.
DOT_F64 = 5


@triton.jit
def _load_x_chunk(x_ptr, rows, cols, m_size, k_size, x_stride_m) -> tl.tensor:
    mask = (rows[:, None] < m_size) & (cols[None, :] < k_size)
    return tl.load(x_ptr + rows[:, None] * x_stride_m + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _load_w_chunk(w_ptr, w_rows, n_mask, cols, k_size) -> tl.tensor:
    """W[w_rows, cols] as [32, BLOCK_N] (K-major, the dot's right operand)."""
    mask = n_mask[None, :] & (cols[:, None] < k_size)
    return tl.load(w_ptr + w_rows[None, :] * k_size + cols[:, None], mask=mask, other=0.0)


@triton.jit
def _split_dot(a, b, PIECE: tl.constexpr) -> tl.tensor:
    a = a.to(tl.float32)
    b = b.to(PIECE)
    hi = a.to(tl.bfloat16)
    rest = a - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    part = tl.dot(hi.to(PIECE), b, out_dtype=tl.float32)
    part = tl.dot(mid.to(PIECE), b, part, out_dtype=tl.float32)
    return tl.dot(lo.to(PIECE), b, part, out_dtype=tl.float32)


@triton.jit
def chunk_dot(a, b, DOT_KIND: tl.constexpr) -> tl.tensor:
    """a [BM, 32] . b [32, BN] in FP32 (one fresh accumulator), the activation's FP8-g32 scale applied."""
    if DOT_KIND == 0:
        a, a_scale = fp8_g32_quantize(a.to(tl.float32))
        part = tl.dot(a, b, out_dtype=tl.float32) * a_scale[:, None]
    elif DOT_KIND == 1:
        part = tl.dot(a, b.to(a.dtype), out_dtype=tl.float32)
    elif DOT_KIND == 2:
        part = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DOT_KIND == 3:
        part = _split_dot(a, b, tl.bfloat16)
    elif DOT_KIND == 5:
        part = tl.dot(a.to(tl.float64), b.to(tl.float64)).to(tl.float32)
    else:
        part = _split_dot(a, b, tl.float32)
    return part


@triton.jit
def _chunk_part(
    x_base, w_ptr, s_ptr, rows, w_rows, n_mask, c0, m_size, k_size, x_stride_m, s_stride,
    DOT_KIND: tl.constexpr, HAS_SCALE: tl.constexpr, EVEN_K: tl.constexpr,
) -> tl.tensor:  # fmt: skip
    """The FP32 product of the 32-column chunk starting at column c0, both scales applied."""
    cols = c0 + tl.arange(0, 32)
    m_mask = rows < m_size
    k_ok = c0 < k_size  # a chunk past K (K not a multiple of BLOCK_K): masked to zero
    if EVEN_K:
        a = tl.load(x_base + rows[:, None] * x_stride_m + cols[None, :], mask=m_mask[:, None], other=0.0)
        b = tl.load(w_ptr + w_rows[None, :] * k_size + cols[:, None], mask=n_mask[None, :], other=0.0)
    else:
        a = _load_x_chunk(x_base, rows, cols, m_size, k_size, x_stride_m)
        b = _load_w_chunk(w_ptr, w_rows, n_mask, cols, k_size)
    part = chunk_dot(a, b, DOT_KIND)
    if HAS_SCALE:
        # The scale of a chunk past K must not be read: the byte past the last scale row may be 255 (NaN),
        # and 0 * NaN is NaN.
        s = tl.load(s_ptr + (w_rows // 32) * s_stride + c0 // 32, mask=n_mask & k_ok, other=127)
        part = part * e8m0_to_f32(s)[None, :]
    return part


@triton.jit
def store_tile(acc, out_ptr, part_ptr, count_ptr, offs, mask, split, size, SPLITS: tl.constexpr) -> None:
    """Write one program's FP32 tile `acc` at element offsets `offs` of out (contiguous): rounded to out's
    dtype when K is not split; else as split `split`'s partial (part_ptr + split * size + offs), and the
    tile's last split to arrive (an atomic count per tile) adds the partials in increasing K order,
    ((p0 + p1) + p2) + ..., rounds once and resets the count for the next launch. The same sums in the
    same order as a separate reduction pass, so the same bits, in one launch fewer."""
    if SPLITS == 1:
        tl.store(out_ptr + offs, round_f32_to(acc, out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + split * size + offs, acc, mask=mask)
        # every thread's partial is written before the count says so (the release is cumulative over
        # what the barrier ordered); the reader's acquire and L2 loads (.cg) see them
        tl.debug_barrier()
        tile = (tl.program_id(2) // SPLITS * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0)
        tile += tl.program_id(0)
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            total = tl.load(part_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLITS):
                total += tl.load(part_ptr + s * size + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + offs, round_f32_to(total, out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def linear_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, m_size, n_size, x_stride_m, x_stride_g,
    out_stride_m, out_stride_g, out_size, s_stride, w2_ptr, out2_ptr, part2_ptr, n2_size, out2_size,
    K_SIZE: tl.constexpr, K_SPLIT: tl.constexpr,
    DOT_KIND: tl.constexpr, HAS_SCALE: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PAIR: tl.constexpr = False, PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = 0,
) -> None:  # fmt: skip
    """Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), G * K_SIZE / K_SPLIT). x [M, G, K] (unit stride along K),
    W [G*N, K], scales [ceil(G*N/32), ceil(K/32)] UE8M0 bytes (HAS_SCALE), out [M, G, N] contiguous
    (out_size elements). EVEN_K: K_SPLIT is a multiple of BLOCK_K (no K masks).
    Split s of K (K_SPLIT < K_SIZE) sums columns [s K_SPLIT, (s + 1) K_SPLIT) into its FP32 partial, and
    the tile's last split adds them (`store_tile`; part_ptr: [splits, out_size] FP32, count_ptr: one
    zeroed int32 per tile); K_SPLIT == K_SIZE writes out directly.
    Whatever BLOCK_K, chunks of 32 columns are accumulated one at a time in increasing K order.
    PAIR (one group, no scales): a second weight w2 (n2_size rows) read by the same x into its own out2
    [M, 1, N2]: the grid's first cdiv(N, BLOCK_N) column tiles are the first weight's, the rest the
    second's, each computed as a launch of its own weight computes it (the same bits, one launch).
    PDL: waits for the previous kernel itself (pdl_tl.enter), after asking L2 for the first PREFETCH
    bytes (a multiple of 16) of each of the program's weight rows (one row tile of M: the decode GEMVs)."""
    SPLITS: tl.constexpr = K_SIZE // K_SPLIT
    pid_n, pid_m, pid_gs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PAIR:  # selects, not a branch (as linear_bf16_tl.gemm_kernel: an int argument of 1 is constexpr)
        first_tiles = tl.cdiv(n_size, BLOCK_N)
        second = pid_n >= first_tiles
        pid_n = tl.where(second, pid_n - first_tiles, pid_n)
        w_ptr, out_ptr, part_ptr = (
            tl.where(second, w2_ptr, w_ptr),
            tl.where(second, out2_ptr, out_ptr),
            tl.where(second, part2_ptr, part_ptr),
        )
        out_stride_m = tl.where(second, n2_size, out_stride_m)  # one group: out_stride_g multiplies 0
        out_size, n_size = tl.where(second, out2_size, out_size), tl.where(second, n2_size, n_size)
    g, split = pid_gs // SPLITS, pid_gs % SPLITS
    # int64 rows: a 64k-token prefill times a 32768-wide row passes 2^31 elements.
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < n_size
    w_rows = g * n_size + n
    x_base = x_ptr + g * x_stride_g
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = split * K_SPLIT
    if PREFETCH:  # the weight is no kernel's output: its bytes may come before the wait
        W_BYTES: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
        rows_in = tl.minimum(w_rows, g * n_size + n_size - 1).to(tl.int64)
        NBYTES: tl.constexpr = PREFETCH if PREFETCH < K_SPLIT * W_BYTES else K_SPLIT * W_BYTES
        pdl_tl.prefetch_l2(w_ptr + rows_in * K_SIZE + k_lo, tl.full((BLOCK_N,), NBYTES, tl.int32))
    pdl_tl.enter(PDL)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        for kk in tl.static_range(BLOCK_K // 32):
            acc += _chunk_part(
                x_base, w_ptr, s_ptr, rows, w_rows, n_mask, k_lo + k0 + kk * 32, m_size, K_SIZE, x_stride_m,
                s_stride, DOT_KIND, HAS_SCALE, EVEN_K,
            )  # fmt: skip
    offs = g * out_stride_g + rows[:, None] * out_stride_m + n[None, :]
    mask = (rows[:, None] < m_size) & n_mask[None, :]
    store_tile(acc, out_ptr, part_ptr, count_ptr, offs, mask, split, out_size, SPLITS)


def launch(
    x: Tensor, w: Tensor, scale: Tensor | None, out: Tensor, dot_kind: int, tiles: Sequence[Any],
    splits: int = 1,
) -> None:  # fmt: skip
    """x [M, G, K], w [G*N, K], scale (uint8 view) or None, out [M, G, N] (contiguous); tiles = (BLOCK_M,
    BLOCK_N, BLOCK_K, num_warps, num_stages, ...). splits > 1 (K a multiple of BLOCK_K * splits): K is cut
    into that many equal ranges, summed into FP32 partials that the last range of each tile adds in order
    (linear.py picks splits from the weight's shape only)."""
    launch_weights(x, ((w, out),), scale, dot_kind, tiles, splits)


def launch_weights(
    x: Tensor, weights: tuple[tuple[Tensor, Tensor], ...], scale: Tensor | None, dot_kind: int,
    tiles: Sequence[Any], splits: int = 1,
) -> None:  # fmt: skip
    """`launch` for one (w, out), or for a pair of dense weights (no scale) read by the same x [M, 1, K]
    in one launch, each out [M, 1, N_i] with the bits of a launch of its own (the caller gives both the
    K splits of each)."""
    m_size, groups, k_size = x.shape
    block_m, block_n, block_k, num_warps, num_stages = tiles[:5]
    if splits < 1 or (splits > 1 and k_size % (block_k * splits)):
        raise ValueError(
            f"linear: {splits} K splits of K = {k_size}, expected K a multiple of BLOCK_K ({block_k}) "
            "times the splits"
        )
    if len(weights) not in (1, 2) or (len(weights) == 2 and (groups != 1 or scale is not None)):
        raise ValueError(
            f"linear: one weight, or a dense pair over one group; got {len(weights)} over {groups}"
        )
    k_split = k_size // splits
    (w, out), (w2, out2) = weights[0], weights[-1]
    tiles_n = sum(triton.cdiv(o.shape[2], block_n) for _, o in weights)
    grid = (tiles_n, triton.cdiv(m_size, block_m), groups * splits)
    part, counts = split_buffers(out, splits, grid)
    part2 = split_buffers(out2, splits, grid)[0] if len(weights) == 2 else part
    pdl_args = pdl.launch()
    aligned = (
        all(t.data_ptr() % 16 == 0 and (k_size * t.element_size()) % 16 == 0 for t, _ in weights)
        and (k_split * w.element_size()) % 16 == 0
    )
    linear_kernel[grid](
        x, w, scale if scale is not None else w, out, part, counts, m_size, out.shape[2], x.stride(0),
        x.stride(1), out.stride(0), out.stride(1), out.numel(), scale.stride(0) if scale is not None else 0,
        w2, out2, part2, out2.shape[2], out2.numel(),
        K_SIZE=k_size, K_SPLIT=k_split, DOT_KIND=dot_kind, HAS_SCALE=scale is not None,
        EVEN_K=k_split % block_k == 0, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PAIR=len(weights) == 2, PREFETCH=pdl.prefetch_bytes() // 16 * 16 if aligned and grid[1] == 1 else 0,
        num_warps=num_warps, num_stages=num_stages, **pdl_args,
    )  # fmt: skip


def split_buffers(out: Tensor, splits: int, grid: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
    """The FP32 partials [splits, *out.shape] and tile counts of a split GEMM (out itself for one range:
    the kernel then reads neither)."""
    if splits == 1:
        return out, out
    part = torch.empty((splits, *out.shape), dtype=torch.float32, device=out.device)
    return part, arrival_counts(out.device, grid[0] * grid[1] * (grid[2] // splits))
