"""A Gluon variant of the decode (swapped) FP8 linear, kept as a measured experiment, not a default:
linear_gl_ab.py times it against platform/cuda/kernels/linear_bf16_tl.gemm_kernel's swapped tiles.

The question it answers (issue 15 item 1): is the Triton kernel slow at decode because each step waits
for the E4M3 tile to be dequantized into the wgmma's register operand and for that wgmma, before the next
step (bench/logs/decode-linear-dequant-probes-H200-1707faf.md)? Here one warpgroup runs a ring of
cp.async stages (E4M3 weight bytes and the activation tile), dequantizes step i into a shared-memory bf16
tile while the wgmma of step i - 1 runs, and keeps one wgmma in flight, so the conversion is off the
tensor core's critical path. Answer on an H100 (bench/results/linear-gl-ab-*.json): the same bits on
every decode shape, but only 1.0-1.3x faster; the decode linears stay at 11-63% of the copy rate, so the
conversion chain is not what bounds them (see the bench log for where the time goes instead).

Same bits as the Triton kernel: the weight tile is the same exact bf16 values (E4M3 x 2^(s - 127),
converted the same way), each 64-row tile of out^T chains one FP32 accumulator through bf16 m64nXk16
wgmmas in increasing K order (split activations: hi, mid, lo per 32 columns, as _dot_x orders them),
and K ranges are added by the tile's last range in increasing order (linear_tl.store_tile itself, and
quant_tl's scale decode: Triton helpers compile inside a Gluon kernel, to the same PTX).
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from dsgraph.platform.cuda.kernels.linear_tl import split_buffers, store_tile
from dsgraph.platform.cuda.kernels.quant_tl import e8m0_to_f32

BLOCK_N = gl.constexpr(64)  # weight rows per program: the wgmma's M side
CHUNK = gl.constexpr(32)  # columns per scale block (and per split-piece dot)


@gluon.jit
def _issue(w_ring, x_ring, stage, w_ptr, x_ptr, w_rows, n_mask, x_rows, m_mask, k0, K_SIZE: gl.constexpr,
           W3: gl.constexpr, XL: gl.constexpr, BLOCK_K: gl.constexpr):  # fmt: skip
    """cp.async one step's E4M3 weight tile [BLOCK_N, BLOCK_K / 16, 16] and activation tile [BM, BLOCK_K]."""
    c16 = gl.arange(0, BLOCK_K // 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, W3)))
    c1 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, W3)))
    cols = k0 + gl.expand_dims(gl.expand_dims(c16 * 16, 0), 2) + gl.expand_dims(gl.expand_dims(c1, 0), 1)
    rows3 = gl.expand_dims(gl.expand_dims(w_rows, 1), 2)
    mask3 = gl.expand_dims(gl.expand_dims(n_mask, 1), 2)
    async_copy.async_copy_global_to_shared(w_ring.index(stage), w_ptr + rows3 * K_SIZE + cols, mask=mask3)
    xc = k0 + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, XL))
    x_off = gl.expand_dims(x_rows, 1) + gl.expand_dims(xc, 0)
    async_copy.async_copy_global_to_shared(x_ring.index(stage), x_ptr + x_off, mask=gl.expand_dims(m_mask, 1))


@gluon.jit
def _split_pieces(x_ring, stage, pieces, buf, XL: gl.constexpr):
    """An FP32 activation tile as three exact bf16 pieces hi + mid + lo (8 significant bits each), stored
    as pieces[3 buf .. 3 buf + 2] (linear_bf16_tl._dot_x's split)."""
    xf = x_ring.index(stage).load(XL)
    hi = xf.to(gl.bfloat16)
    rest = xf - hi.to(gl.float32)
    mid = rest.to(gl.bfloat16)
    lo = (rest - mid.to(gl.float32)).to(gl.bfloat16)
    pieces.index(3 * buf).store(hi)
    pieces.index(3 * buf + 1).store(mid)
    pieces.index(3 * buf + 2).store(lo)


@gluon.jit
def _mma_step(acc, w_tile, x_tile, pieces, buf, X_SPLIT: gl.constexpr, BLOCK_K: gl.constexpr):
    """Issue one step's wgmmas: one dot over BLOCK_K (bf16 activations), or per 32-column chunk the dots
    of hi, mid and lo (split activations), in the Triton kernel's order."""
    if X_SPLIT:
        for c in gl.static_range(BLOCK_K // CHUNK):
            w_c = w_tile.slice(c * CHUNK, CHUNK, dim=1)
            for p in gl.static_range(3):
                x_c = pieces.index(3 * buf + p).slice(c * CHUNK, CHUNK, dim=1)
                acc = warpgroup_mma(w_c, x_c.permute((1, 0)), acc, is_async=True)
    else:
        acc = warpgroup_mma(w_tile, x_tile.permute((1, 0)), acc, is_async=True)
    return acc


@gluon.jit
def _scales(s_ptr, w_rows, n_mask, k0, s_stride, W3: gl.constexpr, BLOCK_K: gl.constexpr):
    """The UE8M0 byte of every (row, 16-column piece) of a step, as [BLOCK_N, BLOCK_K / 16]."""
    pieces = gl.arange(0, BLOCK_K // 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, W3)))
    blocks = k0 // CHUNK + pieces // 2
    ptrs = s_ptr + gl.expand_dims(w_rows // 32, 1) * s_stride + gl.expand_dims(blocks, 0)
    return gl.load(ptrs, mask=gl.expand_dims(n_mask, 1), other=127)


@gluon.jit
def fp8_decode_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, m_size, n_size, x_stride_m, x_stride_g,
    out_stride_m, out_stride_g, out_size, s_stride, K_SIZE: gl.constexpr, K_SPLIT: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, X_SPLIT: gl.constexpr,
    num_warps: gl.constexpr,
) -> None:  # fmt: skip
    """Grid (cdiv(N, 64), cdiv(M, BLOCK_M), G * K_SIZE / K_SPLIT); arguments as gemm_kernel's (x [M, G, K]
    with unit K stride: bf16 operands, or FP32 split into pieces when X_SPLIT; W E4M3 [G*N, K] with
    UE8M0 scales; out [M, G, N] contiguous bf16 or FP32). K_SPLIT is a multiple of BLOCK_K."""
    SPLITS: gl.constexpr = K_SIZE // K_SPLIT
    STEPS: gl.constexpr = K_SPLIT // BLOCK_K
    PIECES: gl.constexpr = BLOCK_K // 16
    TPW_C: gl.constexpr = 32 if PIECES > 32 else PIECES
    # E4M3 bytes: each thread 16 contiguous bytes of one row (one 16-byte cp.async, one smem load)
    W3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [32 // TPW_C, TPW_C, 1], [num_warps, 1, 1], [2, 1, 0])
    X_VEC: gl.constexpr = 4 if X_SPLIT else 8  # activations per 16 bytes
    XV: gl.constexpr = BLOCK_K // X_VEC if BLOCK_K // X_VEC < 32 else 32
    XL: gl.constexpr = gl.BlockedLayout([1, X_VEC], [32 // XV, XV], [num_warps, 1], [1, 0])
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_M, 16])  # fmt: skip
    RAW: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    WS: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.bfloat16)
    XS: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.bfloat16)
    X_DTYPE: gl.constexpr = gl.float32 if X_SPLIT else gl.bfloat16
    XR: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0]) if X_SPLIT else XS

    pid_n, pid_m, pid_gs = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    g, split = pid_gs // SPLITS, pid_gs % SPLITS
    k_lo = split * K_SPLIT
    n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, W3)))
    n_mask = n < n_size
    w_rows = (g * n_size + n).to(gl.int64)
    xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, XL))
    x_rows = g * x_stride_g + xm.to(gl.int64) * x_stride_m
    m_mask = xm < m_size

    w_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, PIECES, 16], RAW)
    x_ring = gl.allocate_shared_memory(X_DTYPE, [STAGES, BLOCK_M, BLOCK_K], XR)
    w_bf16 = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, BLOCK_K], WS)
    pieces = gl.allocate_shared_memory(gl.bfloat16, [6 if X_SPLIT else 1, BLOCK_M, BLOCK_K], XS)

    for s in gl.static_range(STAGES - 1):
        if s < STEPS:
            k0 = k_lo + s * BLOCK_K
            _issue(w_ring, x_ring, s, w_ptr, x_ptr, w_rows, n_mask, x_rows, m_mask, k0, K_SIZE, W3, XL,
                   BLOCK_K)  # fmt: skip
        async_copy.commit_group()
    scale = _scales(s_ptr, w_rows, n_mask, k_lo, s_stride, W3, BLOCK_K)
    acc = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=ACC)
    for i in range(STEPS):
        stage = i % STAGES
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        w8 = w_ring.index(stage).load(W3)
        w = (w8.to(gl.float32) * gl.expand_dims(e8m0_to_f32(scale), 2)).to(gl.bfloat16)
        w_tile = w_bf16.index(i % 2)
        w_tile.store(gl.reshape(w, [BLOCK_N, BLOCK_K]))
        if X_SPLIT:
            _split_pieces(x_ring, stage, pieces, i % 2, XL)
        fence_async_shared()
        gl.thread_barrier()
        acc = _mma_step(acc, w_tile, x_ring.index(stage), pieces, i % 2, X_SPLIT, BLOCK_K)
        # the wgmma of step i - 1 is done: its stage (and its bf16 tile) may be refilled
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        nxt = i + STAGES - 1
        if nxt < STEPS:
            _issue(w_ring, x_ring, nxt % STAGES, w_ptr, x_ptr, w_rows, n_mask, x_rows, m_mask,
                   k_lo + nxt * BLOCK_K, K_SIZE, W3, XL, BLOCK_K)  # fmt: skip
        async_copy.commit_group()
        if i + 1 < STEPS:
            scale = _scales(s_ptr, w_rows, n_mask, k_lo + (i + 1) * BLOCK_K, s_stride, W3, BLOCK_K)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    async_copy.wait_group(0)

    on = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
    om = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
    offs = g * out_stride_g + gl.expand_dims(om, 0).to(gl.int64) * out_stride_m + gl.expand_dims(on, 1)
    mask = gl.expand_dims(om < m_size, 0) & gl.expand_dims(on < n_size, 1)
    store_tile(acc, out_ptr, part_ptr, count_ptr, offs, mask, split, out_size, SPLITS)


def launch(
    x: Tensor,
    w: Tensor,
    scale: Tensor,
    out: Tensor,
    splits: int,
    block_m: int = 16,
    block_k: int = 128,
    stages: int = 4,
) -> None:
    """x [M, G, K] bf16 (or FP32: split pieces) with unit K stride, w [G*N, K] E4M3, scale its UE8M0 bytes
    (uint8 view), out [M, G, N] contiguous; splits: linear.k_splits of the weight (K a multiple of
    block_k x splits)."""
    m_size, groups, k_size = x.shape
    n_size = out.shape[2]
    grid = (triton.cdiv(n_size, BLOCK_N.value), triton.cdiv(m_size, block_m), groups * splits)
    part, counts = split_buffers(out, splits, grid)
    fp8_decode_kernel[grid](
        x, w, scale, out, part, counts, m_size, n_size, x.stride(0), x.stride(1), out.stride(0),
        out.stride(1), out.numel(), scale.stride(0), K_SIZE=k_size, K_SPLIT=k_size // splits,
        BLOCK_M=block_m, BLOCK_K=block_k, STAGES=stages, X_SPLIT=x.dtype == torch.float32, num_warps=4,
    )  # fmt: skip
