"""Triton kernels behind `moe_experts` and `swiglu` (rules in moe.py, which imports this lazily).

`expert_gemm_kernel` is a grouped GEMM over rows already sorted by expert: program (n tile, tile) reads the
tile table (expert, first row, end row) built on the device by moe.py, so the grid is fixed by the step's
shape and nothing is read back to the host (CUDA-graph capturable). Packed MXFP4 weights (two E2M1 codes
per byte, low nibble = even column, a UE8M0 scale per row and 32 columns) are unpacked in registers into
E4M3 bytes of the same values and multiplied on the FP8 tensor cores with the activation FP8-g32 quantized
in the kernel (W4A8, act_quant fp8_g32), or converted to the activation dtype (W4A16, act_quant none).
As in linear_tl.py, K is walked in 32-column chunks (both scale groups) with a fresh FP32 dot per chunk,
scaled and added to an FP32 accumulator: a row's result depends only on that row (batch invariance).
GATED fuses w1 and w3 (one activation tile, two accumulators) with the gemm_out rounding, the clamped
SwiGLU and the routing weight; otherwise the kernel is the w2 GEMM with its gemm_out rounding.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda.kernels.linear_tl import chunk_dot
from dsgraph.platform.cuda.kernels.quant_tl import e2m1_to_e4m3, e8m0_to_f32, round_f32_to, silu_f32

# gemm_out_dtype -> the dtype the expert GEMM outputs are rounded to
GEMM_DTYPES = {"f32": tl.float32, "bf16": tl.bfloat16, "f16": tl.float16}


@triton.jit
def _weight_chunk(
    w_ptr, s_ptr, n, n_mask, chunk, K_SIZE: tl.constexpr, FP4: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Columns chunk*32 .. +32 of weight rows n as [32, BLOCK_N] (E4M3 for FP4 weights, else the weight's
    dtype) and the per-row scale [BLOCK_N] (1 for dense weights)."""
    c = tl.arange(0, 32)
    if FP4:
        # Column c of the chunk is byte c // 2, low nibble for even c: each byte is read twice (from
        # cache), which gives the dot's K order with no register shuffle.
        byte = w_ptr + n[None, :] * (K_SIZE // 2) + chunk * 16 + (c // 2)[:, None]
        b = tl.load(byte, mask=n_mask[None, :], other=0).to(tl.int32)
        w = e2m1_to_e4m3((b >> ((c % 2) * 4)[:, None]) & 0xF)
        scale = e8m0_to_f32(tl.load(s_ptr + n * (K_SIZE // 32) + chunk, mask=n_mask, other=127))
    else:
        cols = chunk * 32 + c
        mask = n_mask[None, :] & (cols[:, None] < K_SIZE)
        w = tl.load(w_ptr + n[None, :] * K_SIZE + cols[:, None], mask=mask, other=0.0)
        scale = tl.full((BLOCK_N,), 1.0, tl.float32)
    return w, scale


@triton.jit
def expert_gemm_kernel(
    a_ptr,
    a_rows_ptr,
    w_ptr,
    s_ptr,
    v_ptr,
    vs_ptr,
    route_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    out_ptr,
    num_experts,
    a_stride,
    limit,
    N_SIZE: tl.constexpr,
    K_SIZE: tl.constexpr,
    W_ROW_LEN: tl.constexpr,
    FP4: tl.constexpr,
    GATED: tl.constexpr,
    DOT_KIND: tl.constexpr,
    GEMM_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
) -> None:
    """out[r, n] for the sorted rows r of one tile: A row a_rows[r], expert weights [E, N, K(/2)]."""
    tile = tl.program_id(1)
    e = tl.load(tile_expert_ptr + tile)
    if e < num_experts:
        start = tl.load(tile_start_ptr + tile)
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < tl.load(tile_end_ptr + tile)
        a_rows = tl.load(a_rows_ptr + rows, mask=row_mask, other=0).to(tl.int64)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = n < N_SIZE
        # int64 expert offsets: 384 experts x 2304 rows x 2560 bytes pass 2^31.
        w_offset = e.to(tl.int64) * N_SIZE * W_ROW_LEN
        s_offset = e.to(tl.int64) * N_SIZE * (K_SIZE // 32)
        w_base, v_base = w_ptr + w_offset, v_ptr + w_offset
        s_base, vs_base = s_ptr + s_offset, vs_ptr + s_offset
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_v = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for chunk in range((K_SIZE + 31) // 32):
            cols = chunk * 32 + tl.arange(0, 32)
            a_mask = row_mask[:, None] & (cols[None, :] < K_SIZE)
            a = tl.load(a_ptr + a_rows[:, None] * a_stride + cols[None, :], mask=a_mask, other=0.0)
            w, w_scale = _weight_chunk(w_base, s_base, n, n_mask, chunk, K_SIZE, FP4, BLOCK_N)
            acc += chunk_dot(a, w, DOT_KIND) * w_scale[None, :]
            if GATED:
                v, v_scale = _weight_chunk(v_base, vs_base, n, n_mask, chunk, K_SIZE, FP4, BLOCK_N)
                acc_v += chunk_dot(a, v, DOT_KIND) * v_scale[None, :]
        # gemm_out_dtype: each expert GEMM's output is rounded to it (DeepInfer writes BF16).
        out = round_f32_to(acc, GEMM_DTYPE).to(tl.float32)
        if GATED:
            g = tl.minimum(out, limit)
            v = round_f32_to(acc_v, GEMM_DTYPE).to(tl.float32)
            v = tl.minimum(tl.maximum(v, -limit), limit)
            route = tl.load(route_ptr + rows, mask=row_mask, other=0.0)
            out = silu_f32(g) * v * route[:, None]
        mask = row_mask[:, None] & n_mask[None, :]
        out_ptrs = out_ptr + rows[:, None].to(tl.int64) * N_SIZE + n[None, :]
        tl.store(out_ptrs, round_f32_to(out, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_kernel(g_ptr, v_ptr, out_ptr, size, limit, BLOCK: tl.constexpr) -> None:
    """silu(min(g, limit)) * clamp(v, -limit, limit), silu in f64 (platform/cpu/rules_moe.swiglu_f32)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act = silu_f32(tl.minimum(g, limit)) * tl.minimum(tl.maximum(v, -limit), limit)
    tl.store(out_ptr + offs, round_f32_to(act, out_ptr.dtype.element_ty), mask=mask)


def launch_expert_gemm(
    a: Tensor,
    a_rows: Tensor,
    weights: tuple[Tensor, Tensor | None, Tensor | None, Tensor | None],
    route: Tensor | None,
    tiles: tuple[Tensor, Tensor, Tensor],
    out: Tensor,
    limit: float,
    config: dict,
) -> None:
    """weights = (w, scale, v, v_scale) (scales None for dense, v None unless gated); tiles = (expert,
    start, end) int32 per tile; config: DOT_KIND, GEMM_DTYPE (a tl dtype), BLOCK_M, BLOCK_N, num_warps,
    num_stages."""
    w, s, v, vs = weights
    num_experts, n_size = w.shape[0], w.shape[1]
    k_size = a.shape[1]
    grid = (triton.cdiv(n_size, config["BLOCK_N"]), tiles[0].shape[0])
    expert_gemm_kernel[grid](
        a,
        a_rows,
        w,
        s if s is not None else w,
        v if v is not None else w,
        vs if vs is not None else (s if s is not None else w),
        route if route is not None else a_rows,
        *tiles,
        out,
        num_experts,
        a.stride(0),
        limit,
        N_SIZE=n_size,
        K_SIZE=k_size,
        W_ROW_LEN=w.shape[2],
        FP4=s is not None,
        GATED=v is not None,
        **config,
    )


def launch_swiglu(g: Tensor, v: Tensor, out: Tensor, limit: float) -> None:
    size = g.numel()
    block = 1024
    swiglu_kernel[(triton.cdiv(size, block),)](g, v, out, size, limit, BLOCK=block, num_warps=4)
