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
`plan_kernel` builds what the GEMMs read (the pairs sorted by expert, the tile table) in one program, and
`combine_kernel` adds each row's expert outputs in increasing expert id in FP32: one launch each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.linear_tl import chunk_dot
from dsgraph.platform.cuda.kernels.quant_act_tl import qdq_tile
from dsgraph.platform.cuda.kernels.quant_tl import e2m1_to_e4m3, e8m0_to_f32, round_f32_to, swiglu_f32

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
    GATHER: tl.constexpr,
    PDL: tl.constexpr = False,
) -> None:
    """out[r, n] for the sorted rows r of one tile: A row a_rows[r] (GATHER, else row r), expert weights
    [E, N, K(/2)]."""
    pdl_tl.enter(PDL)
    tile = tl.program_id(1)
    e = tl.load(tile_expert_ptr + tile)
    if e < num_experts:
        start = tl.load(tile_start_ptr + tile)
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < tl.load(tile_end_ptr + tile)
        if GATHER:
            a_rows = tl.load(a_rows_ptr + rows, mask=row_mask, other=0).to(tl.int64)
        else:
            a_rows = rows.to(tl.int64)
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
            v = round_f32_to(acc_v, GEMM_DTYPE).to(tl.float32)
            route = tl.load(route_ptr + rows, mask=row_mask, other=0.0)
            out = swiglu_f32(out, v, limit) * route[:, None]
        mask = row_mask[:, None] & n_mask[None, :]
        out_ptrs = out_ptr + rows[:, None].to(tl.int64) * N_SIZE + n[None, :]
        tl.store(out_ptrs, round_f32_to(out, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_kernel(
    g_ptr, v_ptr, out_ptr, q_ptr, size, limit, BLOCK: tl.constexpr, OUT: tl.constexpr, RAW: tl.constexpr,
    QDQ: tl.constexpr, GROUP: tl.constexpr, QOUT: tl.constexpr, PDL: tl.constexpr = False,
) -> None:  # fmt: skip
    """silu(min(g, limit)) * clamp(v, -limit, limit), silu in f64 (platform/cpu/rules_moe.swiglu_f32),
    rounded to OUT, stored when RAW. QDQ >= 0 (swiglu_qdq): q = act_qdq of that result, format QDQ, cast
    to QOUT (each run of GROUP elements one group: a row's width is a multiple of GROUP, so is BLOCK)."""
    pdl_tl.enter(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act = round_f32_to(swiglu_f32(g, v, limit), OUT)
    if RAW:
        tl.store(out_ptr + offs, act, mask=mask)
    if QDQ >= 0:
        q = qdq_tile(tl.reshape(act.to(tl.float32), (1, BLOCK)), QDQ, GROUP, QOUT)
        tl.store(q_ptr + offs, tl.reshape(q, (BLOCK,)), mask=mask)


def launch_expert_gemm(
    a: Tensor,
    a_rows: Tensor | None,
    weights: tuple[Tensor, Tensor | None, Tensor | None, Tensor | None],
    route: Tensor | None,
    tiles: tuple[Tensor, Tensor, Tensor],
    out: Tensor,
    limit: float,
    config: dict,
) -> None:
    """weights = (w, scale, v, v_scale) (scales None for dense, v None unless gated); a_rows: the A row of
    each sorted row (None: row r of a); tiles = (expert, start, end) int32 per tile; config: DOT_KIND,
    GEMM_DTYPE (a tl dtype), BLOCK_M, BLOCK_N, num_warps, num_stages."""
    w, s, v, vs = weights
    num_experts, n_size = w.shape[0], w.shape[1]
    k_size = a.shape[1]
    grid = (triton.cdiv(n_size, config["BLOCK_N"]), tiles[0].shape[0])
    expert_gemm_kernel[grid](
        a,
        a_rows if a_rows is not None else tiles[0],
        w,
        s if s is not None else w,
        v if v is not None else w,
        vs if vs is not None else (s if s is not None else w),
        route if route is not None else tiles[0],
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
        GATHER=a_rows is not None,
        **config,
        **pdl.launch(),
    )


SWIGLU_BLOCK = 1024  # elements per swiglu program (a multiple of every quantization group)


def launch_swiglu(
    g: Tensor, v: Tensor, out: Tensor, q: Tensor, limit: float, out_dtype: tl.dtype, raw: bool, qdq: dict
) -> None:  # fmt: skip
    size = g.numel()
    swiglu_kernel[(triton.cdiv(size, SWIGLU_BLOCK),)](
        g, v, out, q, size, limit, BLOCK=SWIGLU_BLOCK, OUT=out_dtype, RAW=raw, **qdq, num_warps=4,
        **pdl.launch()
    )  # fmt: skip


# Pairs per step of the plan kernel's loops (one bitonic sort of this many keys) and tiles per step.
PLAN_BLOCK_P = 256
PLAN_BLOCK_T = 1024
PLAN_WARPS = 8
# Columns per combine program (one row each).
COMBINE_BLOCK_H = 1024


@triton.jit
def _pair_keys(ids_ptr, p, num_pairs, num_experts, E_PAD: tl.constexpr):
    """Sort key of pairs p: the expert id; padding (id < 0) and bad ids num_experts (after every real
    pair); lanes past the last pair E_PAD - 1 (after everything, never stored)."""
    valid = p < num_pairs
    ids = tl.load(ids_ptr + p, mask=valid, other=-1)
    key = tl.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    return tl.where(valid, key, E_PAD - 1), valid


@triton.jit
def plan_kernel(
    ids_ptr,
    weights_ptr,
    scratch_ptr,
    token_ptr,
    route_ptr,
    position_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    num_pairs,
    num_experts,
    num_tiles,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr = False,
) -> None:
    """One program: a stable counting sort of the (row, slot) pairs by expert, and the tile table.

    Pass 1 counts the pairs of each key; pass 2 walks BLOCK_P pairs at a time: a bitonic sort of
    key * BLOCK_P + lane orders the block (stably), and the i-th sorted pair of key e goes to
    (first free place of e) + i - (pairs of lower keys in the block), a per-key value the program stores
    to `scratch` and reads back by key (a barrier between). Sorted place d gets token[d] (the pair's row)
    and route[d] (its routing weight in FP32); position[pair] = d. Pass 3 writes the tiles (expert, first
    row, end row): ceil(count / BLOCK_M) per expert in increasing id, then (num_experts, 0, 0) up to
    num_tiles. Cost: passes over P / BLOCK_P blocks and max tiles per expert; no P^2 or E x tiles term."""
    pdl_tl.enter(PDL)
    bins = tl.arange(0, E_PAD)
    lane = tl.arange(0, BLOCK_P)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    # while loops: Triton's interpreter cannot take range() of a runtime bound (the compiler can)
    base = 0
    while base < num_pairs:
        key, _ = _pair_keys(ids_ptr, base + lane, num_pairs, num_experts, E_PAD)
        counts += tl.histogram(key, E_PAD)
        base += BLOCK_P
    starts = tl.cumsum(counts, 0) - counts
    running = starts
    base = 0
    while base < num_pairs:
        key, _ = _pair_keys(ids_ptr, base + lane, num_pairs, num_experts, E_PAD)
        hist = tl.histogram(key, E_PAD)
        tl.store(scratch_ptr + bins, running - (tl.cumsum(hist, 0) - hist))
        tl.debug_barrier()
        packed = tl.sort(key * BLOCK_P + lane)
        dest = tl.load(scratch_ptr + packed // BLOCK_P, volatile=True) + lane
        pair = base + packed % BLOCK_P
        stored = pair < num_pairs
        tl.store(token_ptr + dest, pair // TOPK, mask=stored)
        tl.store(
            route_ptr + dest, tl.load(weights_ptr + pair, mask=stored, other=0.0).to(tl.float32), mask=stored
        )
        tl.store(position_ptr + pair, dest, mask=stored)
        tl.debug_barrier()  # every read of scratch is done before the next block writes it
        running += hist
        base += BLOCK_P
    # Pass 3, from the experts' side: expert e's tiles are first_tile[e] + i, i < tiles_per[e].
    tiles_per = tl.where(bins < num_experts, (counts + BLOCK_M - 1) // BLOCK_M, 0)
    first_tile = tl.cumsum(tiles_per, 0) - tiles_per
    most = tl.max(tiles_per, 0)
    i = 0
    while i < most:
        has = i < tiles_per
        tl.store(tile_expert_ptr + first_tile + i, bins, mask=has)
        tl.store(tile_start_ptr + first_tile + i, starts + i * BLOCK_M, mask=has)
        tl.store(tile_end_ptr + first_tile + i, starts + counts, mask=has)
        i += 1
    base = tl.sum(tiles_per, 0)
    while base < num_tiles:
        tile = base + tl.arange(0, BLOCK_T)
        past = tile < num_tiles
        tl.store(tile_expert_ptr + tile, tl.full((BLOCK_T,), 0, tl.int32) + num_experts, mask=past)
        tl.store(tile_start_ptr + tile, tl.zeros((BLOCK_T,), tl.int32), mask=past)
        tl.store(tile_end_ptr + tile, tl.zeros((BLOCK_T,), tl.int32), mask=past)
        base += BLOCK_T


@triton.jit
def combine_kernel(
    y_ptr,
    ids_ptr,
    position_ptr,
    out_ptr,
    num_experts,
    hidden,
    TOPK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr = False,
) -> None:
    """out[row] = ((0 + y[first]) + y[second]) + ... in FP32 over the row's real pairs in increasing
    expert id (equal ids by slot), y[d] the output of sorted place d = position[pair]; rounded once."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_mask = cols < hidden
    slot = tl.arange(0, BLOCK_K)
    in_row = slot < TOPK
    ids = tl.load(ids_ptr + row * TOPK + slot, mask=in_row, other=-1)
    real = in_row & (ids >= 0) & (ids < num_experts)
    key = tl.where(real, ids, num_experts)
    place = tl.load(position_ptr + row * TOPK + slot, mask=in_row, other=0)
    # rank of each slot in (key, slot) order
    before = (key[None, :] < key[:, None]) | (
        (key[None, :] == key[:, None]) & (slot[None, :] < slot[:, None])
    )
    rank = tl.sum(before.to(tl.int32), axis=1)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for r in tl.static_range(TOPK):
        pick = rank == r
        d = tl.sum(tl.where(pick, place, 0), axis=0).to(tl.int64)
        used = tl.sum(tl.where(pick & real, 1, 0), axis=0) > 0
        # A padding slot loads +0: acc starts at +0, so adding +0 changes no bit (as the cpu rule skips it).
        y = tl.load(y_ptr + d * hidden + cols, mask=col_mask & used, other=0.0)
        acc += y.to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, round_f32_to(acc, out_ptr.dtype.element_ty), mask=col_mask)


def launch_plan(ids: Tensor, weights: Tensor, num_experts: int, block_m: int, out: dict[str, Tensor]) -> None:
    """out: token, route, position [ids.numel()] and tile_expert, tile_start, tile_end [num_tiles]."""
    e_pad = triton.next_power_of_2(num_experts + 2)
    scratch = torch.empty(e_pad, dtype=torch.int32, device=ids.device)
    plan_kernel[(1,)](
        ids,
        weights,
        scratch,
        out["token"],
        out["route"],
        out["position"],
        out["tile_expert"],
        out["tile_start"],
        out["tile_end"],
        ids.numel(),
        num_experts,
        out["tile_expert"].shape[0],
        TOPK=ids.shape[1],
        BLOCK_M=block_m,
        E_PAD=e_pad,
        BLOCK_P=PLAN_BLOCK_P,
        BLOCK_T=PLAN_BLOCK_T,
        num_warps=PLAN_WARPS,
        **pdl.launch(),
    )


def launch_combine(y: Tensor, ids: Tensor, position: Tensor, num_experts: int, out: Tensor) -> None:
    rows, hidden = out.shape
    if out.numel() == 0:
        return
    block_h = min(COMBINE_BLOCK_H, triton.next_power_of_2(hidden))
    topk = ids.shape[1]
    grid = (rows, triton.cdiv(hidden, block_h))
    combine_kernel[grid](
        y, ids, position, out, num_experts, hidden,
        TOPK=topk, BLOCK_K=triton.next_power_of_2(topk), BLOCK_H=block_h, num_warps=4, **pdl.launch(),
    )  # fmt: skip
