"""The BF16 path of `linear` over FP8 weights: exact operands, one chained FP32 accumulator.

Every operand value of serving numerics is exact in bf16: an FP8-g32 activation is an E4M3 value (4
significant bits) times a power of two, and so is a weight (E4M3 times its UE8M0 block scale). So the
scales can go into the operands instead of into each 32-column partial sum: the activation rows are
quantized and dequantized once (`qdq_rows_kernel`, the cpu codec's bits), the weight tile is dequantized
in registers (or once per call, `dequant_weight_kernel`) and the GEMM is a plain bf16 tensor-core dot
with one FP32 accumulator chained over K. This drops the per-chunk promotion (two FP32 operations per
output element every 32 columns), which bounds the FP8 path, and its products are exact; bf16 dots also
accumulate more precisely than the FP8 ones (see tests/cuda/test_linear.py's bounds).

The values stay exact as long as no scaled value falls below bf16's normal range: a block scale of at
least 2^-117 (UE8M0 byte 10) and activation scales from the codec's floor (1e-4 / 448) are far inside it.

K order: the dots run over K in increasing order into one accumulator whatever BLOCK_K, BLOCK_M or
BLOCK_N, so every tile configuration issues the same sequence of tensor-core steps for an output element
(batch invariance, checked on the GPU by tests/cuda/test_linear.py). K splits (by the weight's shape
only) are summed apart in FP32 and added in order by linear_tl.reduce_splits_kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda.kernels.quant_tl import e8m0_to_f32, fp8_g32_quantize, round_f32_to

QDQ_BLOCK_M = 16  # rows per program of qdq_rows_kernel
DEQUANT_BLOCK = 64  # weight rows and columns per program of dequant_weight_kernel


@triton.jit
def qdq_rows_kernel(x_ptr, y_ptr, m_size, k_size, x_stride_m, x_stride_g, BLOCK_M: tl.constexpr) -> None:
    """Grid (cdiv(M, BLOCK_M), K / 32, G): x [M, G, K] -> y [M, G, K] bf16 holding the FP8-g32
    quantize-dequantize of x (E4M3 value times its power-of-two scale: exact in bf16)."""
    pid_m, chunk, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    groups = tl.num_programs(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = chunk * 32 + tl.arange(0, 32)
    mask = rows[:, None] < m_size
    x = tl.load(x_ptr + g * x_stride_g + rows[:, None] * x_stride_m + cols[None, :], mask=mask, other=0.0)
    q, scale = fp8_g32_quantize(x.to(tl.float32))
    y = (q.to(tl.float32) * scale[:, None]).to(tl.bfloat16)
    tl.store(y_ptr + (rows[:, None] * groups + g) * k_size + cols[None, :], y, mask=mask)


@triton.jit
def dequant_weight_kernel(w_ptr, s_ptr, out_ptr, rows_size, k_size, s_stride, BLOCK: tl.constexpr) -> None:
    """Grid (cdiv(R, BLOCK), cdiv(K, BLOCK)): W [R, K] E4M3 with UE8M0 32x32 scales -> bf16 [R, K]."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (r[:, None] < rows_size) & (c[None, :] < k_size)
    w = tl.load(w_ptr + r[:, None] * k_size + c[None, :], mask=mask, other=0.0)
    s = tl.load(s_ptr + (r[:, None] // 32) * s_stride + c[None, :] // 32, mask=mask, other=127)
    tl.store(out_ptr + r[:, None] * k_size + c[None, :], (w.to(tl.float32) * e8m0_to_f32(s)).to(tl.bfloat16), mask=mask)


@triton.jit
def _acc_dot(a, b, acc, EMU_F32: tl.constexpr) -> tl.tensor:
    # Triton's interpreter multiplies bf16 dot operands as raw integers: off the GPU the same exact
    # products are formed in FP32.
    if EMU_F32:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc, out_dtype=tl.float32)
    return acc


@triton.jit
def bf16_linear_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, m_size, n_size, x_stride_m, x_stride_g, out_stride_m, out_stride_g,
    out_stride_s, s_stride, K_SIZE: tl.constexpr, K_SPLIT: tl.constexpr, W_FP8: tl.constexpr,
    EMU_F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
) -> None:  # fmt: skip
    """Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), G * K_SIZE / K_SPLIT). x [M, G, K] bf16 (unit stride
    along K); W [G*N, K]: E4M3 with UE8M0 scales [ceil(G*N/32), K/32] (W_FP8, dequantized here 32 columns
    at a time) or bf16 (dequantized before, or dense); out [M, G, N] in its dtype, or the FP32 partial of
    split s at out + s * out_stride_s when K is split (K_SPLIT then a multiple of BLOCK_K; EVEN_K: no
    masks along K)."""
    SPLITS: tl.constexpr = K_SIZE // K_SPLIT
    pid_n, pid_m, pid_gs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g, split = pid_gs // SPLITS, pid_gs % SPLITS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = rows < m_size, n < n_size
    w_rows = (g * n_size + n).to(tl.int64)
    x_base = x_ptr + g * x_stride_g + rows[:, None] * x_stride_m
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = split * K_SPLIT
    for k_step in range(0, K_SPLIT, BLOCK_K):
        k0 = k_lo + k_step
        if W_FP8:
            for kk in tl.static_range(BLOCK_K // 32):
                c0 = k0 + kk * 32
                cols = c0 + tl.arange(0, 32)
                a_mask, b_mask = m_mask[:, None], n_mask[None, :]
                if not EVEN_K:
                    a_mask, b_mask = a_mask & (cols[None, :] < K_SIZE), b_mask & (cols[:, None] < K_SIZE)
                a = tl.load(x_base + cols[None, :], mask=a_mask, other=0.0)
                b = tl.load(w_ptr + w_rows[None, :] * K_SIZE + cols[:, None], mask=b_mask, other=0.0)
                # A chunk past K must not read its scale: the byte past the last one may be 255 (NaN).
                s = tl.load(s_ptr + (w_rows // 32) * s_stride + c0 // 32, mask=n_mask & (c0 < K_SIZE), other=127)
                b = (b.to(tl.float32) * e8m0_to_f32(s)[None, :]).to(tl.bfloat16)
                acc = _acc_dot(a, b, acc, EMU_F32)
        else:
            cols = k0 + tl.arange(0, BLOCK_K)
            a_mask, b_mask = m_mask[:, None], n_mask[None, :]
            if not EVEN_K:
                a_mask, b_mask = a_mask & (cols[None, :] < K_SIZE), b_mask & (cols[:, None] < K_SIZE)
            a = tl.load(x_base + cols[None, :], mask=a_mask, other=0.0)
            b = tl.load(w_ptr + w_rows[None, :] * K_SIZE + cols[:, None], mask=b_mask, other=0.0)
            acc = _acc_dot(a, b, acc, EMU_F32)
    out = out_ptr + split * out_stride_s + g * out_stride_g + rows[:, None] * out_stride_m + n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLITS == 1:
        tl.store(out, round_f32_to(acc, out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out, acc, mask=mask)


@triton.jit
def swapped_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, m_size, n_size, x_stride_m, x_stride_g, out_stride_m, out_stride_g,
    out_stride_s, s_stride, K_SIZE: tl.constexpr, K_SPLIT: tl.constexpr, W_FP8: tl.constexpr,
    EMU_F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:  # fmt: skip
    """bf16_linear_kernel with the operands swapped: the tile is out^T [BLOCK_N weight rows, BLOCK_M
    activation rows] = W x^T, so the weight rows fill the tensor core's 64-row side and a decode batch
    of a few rows needs only a 16-column activation tile (less shared memory, more programs per SM).
    Same grid and arguments as bf16_linear_kernel."""
    SPLITS: tl.constexpr = K_SIZE // K_SPLIT
    pid_n, pid_m, pid_gs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g, split = pid_gs // SPLITS, pid_gs % SPLITS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = rows < m_size, n < n_size
    w_rows = (g * n_size + n).to(tl.int64)
    x_base = x_ptr + g * x_stride_g + rows[None, :] * x_stride_m
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_lo = split * K_SPLIT
    for k_step in range(0, K_SPLIT, BLOCK_K):
        k0 = k_lo + k_step
        if W_FP8:
            for kk in tl.static_range(BLOCK_K // 32):
                c0 = k0 + kk * 32
                cols = c0 + tl.arange(0, 32)
                w_mask, x_mask = n_mask[:, None], m_mask[None, :]
                if not EVEN_K:
                    w_mask, x_mask = w_mask & (cols[None, :] < K_SIZE), x_mask & (cols[:, None] < K_SIZE)
                w = tl.load(w_ptr + w_rows[:, None] * K_SIZE + cols[None, :], mask=w_mask, other=0.0)
                xt = tl.load(x_base + cols[:, None], mask=x_mask, other=0.0)
                # A chunk past K must not read its scale: the byte past the last one may be 255 (NaN).
                s = tl.load(s_ptr + (w_rows // 32) * s_stride + c0 // 32, mask=n_mask & (c0 < K_SIZE), other=127)
                w = (w.to(tl.float32) * e8m0_to_f32(s)[:, None]).to(tl.bfloat16)
                acc = _acc_dot(w, xt, acc, EMU_F32)
        else:
            cols = k0 + tl.arange(0, BLOCK_K)
            w_mask, x_mask = n_mask[:, None], m_mask[None, :]
            if not EVEN_K:
                w_mask, x_mask = w_mask & (cols[None, :] < K_SIZE), x_mask & (cols[:, None] < K_SIZE)
            w = tl.load(w_ptr + w_rows[:, None] * K_SIZE + cols[None, :], mask=w_mask, other=0.0)
            xt = tl.load(x_base + cols[:, None], mask=x_mask, other=0.0)
            acc = _acc_dot(w, xt, acc, EMU_F32)
    out = out_ptr + split * out_stride_s + g * out_stride_g + rows[None, :] * out_stride_m + n[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    if SPLITS == 1:
        tl.store(out, round_f32_to(acc, out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out, acc, mask=mask)


def qdq_rows(x: Tensor) -> Tensor:
    """x [M, G, K] (K a multiple of 32, unit stride along K) -> its FP8-g32 qdq, bf16 [M, G, K]."""
    m_size, groups, k_size = x.shape
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    if x.numel():
        grid = (triton.cdiv(m_size, QDQ_BLOCK_M), k_size // 32, groups)
        qdq_rows_kernel[grid](x, y, m_size, k_size, x.stride(0), x.stride(1), BLOCK_M=QDQ_BLOCK_M)
    return y


def dequant_weight(w: Tensor, scale: Tensor) -> Tensor:
    """E4M3 W [R, K] and its UE8M0 bytes [ceil(R/32), ceil(K/32)] -> bf16 [R, K] (exact values)."""
    out = torch.empty(w.shape, dtype=torch.bfloat16, device=w.device)
    grid = (triton.cdiv(w.shape[0], DEQUANT_BLOCK), triton.cdiv(w.shape[1], DEQUANT_BLOCK))
    dequant_weight_kernel[grid](w, scale, out, w.shape[0], w.shape[1], scale.stride(0), BLOCK=DEQUANT_BLOCK)
    return out


def launch(
    x: Tensor, w: Tensor, scale: Tensor | None, out: Tensor, tiles: tuple, splits: int, predequant: bool,
    swapped: bool = False,
) -> None:
    """x [M, G, K] bf16 (already qdq'ed where the op quantizes activations), w [G*N, K] (E4M3 with the
    uint8 scale view, or bf16 with scale None), out [M, G, N] contiguous. predequant: an E4M3 weight is
    dequantized to bf16 once before the GEMM (same values and dots: the same bits)."""
    from dsgraph.platform.cuda.kernels.linear_tl import REDUCE_BLOCK, reduce_splits_kernel

    m_size, groups, k_size = x.shape
    n_size = out.shape[2]
    block_m, block_n, block_k, num_warps, num_stages = tiles[:5]
    if splits > 1 and k_size % (block_k * splits):
        raise ValueError(f"linear: K = {k_size} is not a multiple of BLOCK_K ({block_k}) x {splits} splits")
    w_fp8 = scale is not None
    if w_fp8 and predequant:
        w, scale, w_fp8 = dequant_weight(w, scale), None, False
    target = out if splits == 1 else torch.empty((splits, *out.shape), dtype=torch.float32, device=out.device)
    grid = (triton.cdiv(n_size, block_n), triton.cdiv(m_size, block_m), groups * splits)
    kernel = swapped_kernel if swapped else bf16_linear_kernel
    kernel[grid](
        x, w, scale if scale is not None else w, target, m_size, n_size, x.stride(0), x.stride(1),
        out.stride(0), out.stride(1), out.numel(), scale.stride(0) if scale is not None else 0,
        K_SIZE=k_size, K_SPLIT=k_size // splits, W_FP8=w_fp8, EMU_F32=not x.is_cuda,
        EVEN_K=(k_size // splits) % block_k == 0, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if splits > 1:
        size = out.numel()
        reduce_splits_kernel[(triton.cdiv(size, REDUCE_BLOCK),)](target, out, size, SPLITS=splits, BLOCK=REDUCE_BLOCK)
