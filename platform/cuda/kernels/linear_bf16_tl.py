"""The Triton kernels of `linear` / `grouped_linear` over FP8 weights: exact bf16 operands, one chained
FP32 accumulator (rules in linear.py, which imports this lazily).

Every operand value of serving numerics is exact in bf16: an FP8-g32 activation is an E4M3 value (4
significant bits) times a power of two, and so is a weight (E4M3 times its UE8M0 block scale). So the
scales go into the operands instead of into each 32-column partial sum, and the GEMM is a plain bf16
tensor-core dot with one FP32 accumulator chained over K. That drops the per-chunk promotion (two FP32
operations per output element every 32 columns) which bounds an FP8-dot kernel at these scale blocks,
and bf16 dots accumulate more precisely than Hopper's FP8 ones. An activation that is not bf16 and not
quantized (f32 or f16 with act_quant none) is split exactly into three bf16 pieces (hi + mid + lo, 8
significant bits each), dotted one after the other for every 32-column chunk.

FP8-g32 activations are quantized-dequantized once per call (moe_swap_tl's `qdq_rows_kernel`) in both
layouts: in the GEMM every program would repeat the same rows' codec, which cost more than the weight's
dequantization at decode. One GEMM (`gemm_kernel`) in two layouts, one arithmetic:
- SWAPPED (decode batches): the tile is out^T = W x^T, so the weight rows fill the tensor core's 64-row
  side and a batch of a few rows needs a 16-row activation tile; the weight is dequantized in registers
  32 columns at a time;
- plain (prefill): W dequantized by `dequant_weight_kernel` once per call, then one dot per BLOCK_K
  step.
Both issue, for every output element, the same tensor-core steps in increasing K order (split pieces:
hi, mid, lo per 32 columns), whatever the tiles, so a row's bits do not depend on the batch or on which
kernel served it (tests/cuda/test_linear_bf16.py checks this on the GPU). K splits, chosen from the
weight's shape only, are summed apart in FP32 and added in order by each tile's last split
(linear_tl.store_tile), in the same launch.

Values stay exact while no scaled value leaves bf16's normal range: block scales of at least 2^-117
(UE8M0 byte 10) and the activation codec's scales are far inside it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.linear_tl import store_tile
from dsgraph.platform.cuda.kernels.quant_tl import e8m0_to_f32

X_BF16 = 0  # activations already bf16 operands (qdq'ed by qdq_rows, or bf16 with act_quant none)
X_SPLIT = 2  # f32/f16 activations split into three exact bf16 pieces
DEQUANT_BLOCK = 64  # weight rows and columns per program of dequant_weight_kernel


@triton.jit
def dequant_weight_kernel(
    w_ptr, s_ptr, out_ptr, rows_size, k_size, s_stride, BLOCK: tl.constexpr, PDL: tl.constexpr = False
) -> None:
    """Grid (cdiv(R, BLOCK), cdiv(K, BLOCK)): W [R, K] E4M3 with UE8M0 32x32 scales -> bf16 [R, K]."""
    pdl_tl.enter(PDL)
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (r[:, None] < rows_size) & (c[None, :] < k_size)
    w = tl.load(w_ptr + r[:, None] * k_size + c[None, :], mask=mask, other=0.0)
    s = tl.load(s_ptr + (r[:, None] // 32) * s_stride + c[None, :] // 32, mask=mask, other=127)
    w = (w.to(tl.float32) * e8m0_to_f32(s)).to(tl.bfloat16)
    tl.store(out_ptr + r[:, None] * k_size + c[None, :], w, mask=mask)


@triton.jit
def _dot(a, b, acc, EMU_F32: tl.constexpr) -> tl.tensor:
    # Triton's interpreter multiplies bf16 dot operands as raw integers, and its FP32 dot sums in an
    # order that depends on the tile shape: off the GPU the exact products are summed in FP64 (exact for
    # these operands) and added to the FP32 accumulator once per dot, so rows stay batch invariant.
    if EMU_F32:
        acc += tl.dot(a.to(tl.float64), b.to(tl.float64)).to(tl.float32)
    else:
        acc = tl.dot(a, b, acc, out_dtype=tl.float32)
    return acc


@triton.jit
def _dot_x(w, x, acc, X_MODE: tl.constexpr, SWAPPED: tl.constexpr, EMU_F32: tl.constexpr) -> tl.tensor:
    """acc + x . w^T (or, SWAPPED, acc^T + w . x^T) for one chunk: w [BN, C] bf16, x [BM, C] raw."""
    if X_MODE == 2:
        xf = x.to(tl.float32)
        hi = xf.to(tl.bfloat16)
        rest = xf - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
        if SWAPPED:
            acc = _dot(w, tl.trans(hi), acc, EMU_F32)
            acc = _dot(w, tl.trans(mid), acc, EMU_F32)
            acc = _dot(w, tl.trans(lo), acc, EMU_F32)
        else:
            acc = _dot(hi, tl.trans(w), acc, EMU_F32)
            acc = _dot(mid, tl.trans(w), acc, EMU_F32)
            acc = _dot(lo, tl.trans(w), acc, EMU_F32)
    else:
        if SWAPPED:
            acc = _dot(w, tl.trans(x), acc, EMU_F32)
        else:
            acc = _dot(x, tl.trans(w), acc, EMU_F32)
    return acc


@triton.jit
def _load_chunk(x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, c0, s_stride, K_SIZE: tl.constexpr,
                WIDTH: tl.constexpr, W_FP8: tl.constexpr, EVEN_K: tl.constexpr) -> tuple:  # fmt: skip
    """x [BM, WIDTH] as stored and W [BN, WIDTH] as bf16 (dequantized here when W_FP8; WIDTH is 32
    then) at columns c0 .. c0 + WIDTH - 1."""
    cols = c0 + tl.arange(0, WIDTH)
    x_mask, w_mask = m_mask[:, None], n_mask[:, None]
    if not EVEN_K:
        x_mask, w_mask = x_mask & (cols[None, :] < K_SIZE), w_mask & (cols[None, :] < K_SIZE)
    x = tl.load(x_base + cols[None, :], mask=x_mask, other=0.0)
    w = tl.load(w_ptr + w_rows[:, None] * K_SIZE + cols[None, :], mask=w_mask, other=0.0)
    if W_FP8:
        # A chunk past K must not read its scale: the byte past the last one may be 255 (NaN).
        s = tl.load(s_ptr + (w_rows // 32) * s_stride + c0 // 32, mask=n_mask & (c0 < K_SIZE), other=127)
        w = (w.to(tl.float32) * e8m0_to_f32(s)[:, None]).to(tl.bfloat16)
    return x, w


@triton.jit
def _load_step(x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, c0, s_stride, K_SIZE: tl.constexpr,
               EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr) -> tuple:  # fmt: skip
    """A whole step at once (WIDE): x [BM, BLOCK_K] as bf16 operands and W [BN, BLOCK_K] dequantized
    here, each scale block of 32 columns by its own scale. One load per operand and step keeps BLOCK_K
    bytes of each weight row in flight (16-byte vectors)."""
    GROUPS: tl.constexpr = BLOCK_K // 32
    x, w = _load_chunk(x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, c0, s_stride, K_SIZE, BLOCK_K, False,
                       EVEN_K)  # fmt: skip
    blocks = c0 // 32 + tl.arange(0, GROUPS)
    s_mask = n_mask[:, None] & (blocks[None, :] < -(-K_SIZE // 32))  # no scale byte past K is read
    s = tl.load(s_ptr + (w_rows // 32)[:, None] * s_stride + blocks[None, :], mask=s_mask, other=127)
    w3 = tl.reshape(w.to(tl.float32), (BLOCK_N, GROUPS, 32)) * e8m0_to_f32(s)[:, :, None]
    w = tl.reshape(w3, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)
    return x.to(tl.bfloat16), w


@triton.jit
def _dot_step(w, x, acc, EMU_F32: tl.constexpr, BLOCK_K: tl.constexpr) -> tl.tensor:
    """acc^T + w . x^T over one WIDE step: on the GPU one dot (the same tensor-core steps, in the same
    order, as BLOCK_K / 32 chunk dots); under the interpreter one FP64 dot per 32-column chunk (the
    others masked to zero, which adds exactly nothing), as the chunked path rounds."""
    if EMU_F32:
        chunk = tl.arange(0, BLOCK_K) // 32
        for kk in tl.static_range(BLOCK_K // 32):
            sel = (chunk == kk)[None, :]
            acc = _dot(tl.where(sel, w, 0.0), tl.trans(tl.where(sel, x, 0.0)), acc, True)
    else:
        acc = _dot(w, tl.trans(x), acc, False)
    return acc


@triton.jit
def _k_range(acc, x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, k_lo, s_stride, K_SIZE: tl.constexpr,
             K_SPLIT: tl.constexpr, W_FP8: tl.constexpr, X_MODE: tl.constexpr, SWAPPED: tl.constexpr,
             EMU_F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             WIDE: tl.constexpr) -> tl.tensor:  # fmt: skip
    """acc + the dots of columns [k_lo, k_lo + K_SPLIT) in steps of BLOCK_K, in increasing K order."""
    CHUNKED: tl.constexpr = W_FP8 or X_MODE != 0
    for k_step in range(0, K_SPLIT, BLOCK_K):
        if WIDE:
            x, w = _load_step(x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, k_lo + k_step, s_stride, K_SIZE,
                              EVEN_K, BLOCK_N, BLOCK_K)  # fmt: skip
            acc = _dot_step(w, x, acc, EMU_F32, BLOCK_K)
        elif CHUNKED:
            for kk in tl.static_range(BLOCK_K // 32):
                x, w = _load_chunk(x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, k_lo + k_step + kk * 32,
                                   s_stride, K_SIZE, 32, W_FP8, EVEN_K)  # fmt: skip
                acc = _dot_x(w, x, acc, X_MODE, SWAPPED, EMU_F32)
        else:
            x, w = _load_chunk(x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, k_lo + k_step, s_stride,
                               K_SIZE, BLOCK_K, False, EVEN_K)  # fmt: skip
            acc = _dot_x(w, x, acc, X_MODE, SWAPPED, EMU_F32)
    return acc


@triton.jit
def _add_sums(total, part, EMU_F32: tl.constexpr) -> tl.tensor:
    """total + part, one FP32 add. On the GPU an instruction of its own: a range of one dot step has no
    loop left, and Triton folds add(dot(a, b, 0), c) into dot(a, b, c), which would sum in another
    order (the test of a 256-column range at BLOCK_K 256 showed it)."""
    if EMU_F32:
        return total + part
    operands = [total.to(tl.int32, bitcast=True), part.to(tl.int32, bitcast=True)]
    bits = tl.inline_asm_elementwise(
        "add.rn.f32 $0, $1, $2;", "=r,r,r", operands, dtype=tl.int32, is_pure=True, pack=1
    )
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def gemm_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, m_size, n_size, x_stride_m, x_stride_g,
    out_stride_m, out_stride_g, out_size, s_stride, w2_ptr, s2_ptr, out2_ptr, part2_ptr, n2_size,
    out2_size, s2_stride, K_SIZE: tl.constexpr, K_SPLIT: tl.constexpr,
    W_FP8: tl.constexpr, X_MODE: tl.constexpr, SWAPPED: tl.constexpr, EMU_F32: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    WIDE: tl.constexpr, IN_PROGRAM: tl.constexpr, PAIR: tl.constexpr, PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = 0,
) -> None:  # fmt: skip
    """Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), G * K_SIZE / K_SPLIT, or G when IN_PROGRAM). x [M, G, K]
    (unit stride along K); W [G*N, K]: E4M3 with UE8M0 scales [ceil(G*N/32), K/32] (W_FP8) or bf16; out
    [M, G, N] contiguous (out_size elements) in its dtype. K is summed in ranges of K_SPLIT columns
    (K_SPLIT then a multiple of BLOCK_K), each from zero, and the ranges' FP32 sums added in increasing K
    order: by one program per range, whose partials the tile's last range adds (linear_tl.store_tile),
    or IN_PROGRAM by one program that sums the ranges one after the other and adds each to the total as
    it ends (the same sums in the same order: the same bits, without partials in memory). SWAPPED
    accumulates out^T tiles. A step of BLOCK_K columns is one dot when both operands are bf16 already,
    else BLOCK_K / 32 chunks (same tensor-core steps, same order), or (WIDE, swapped without split
    pieces) one load and dequantization of the whole step, then one dot. PAIR (one group): a second
    weight (w2, s2: n2_size rows) read by the same x into its own out2 [M, 1, N2]: the grid's first
    cdiv(N, BLOCK_N) column tiles are the first weight's, the rest the second's, each tile computed as
    a launch of its own weight computes it (the same bits, one launch for both). PDL: waits for the
    previous kernel itself (pdl_tl.enter), after asking L2 for the first PREFETCH bytes (a multiple of
    16) of each of the program's weight rows."""
    SPLITS: tl.constexpr = K_SIZE // K_SPLIT
    pid_n, pid_m, pid_gs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PAIR:  # selects, not a branch: a launch may pass an int argument of 1, which Triton makes constexpr
        first_tiles = tl.cdiv(n_size, BLOCK_N)
        second = pid_n >= first_tiles
        pid_n = tl.where(second, pid_n - first_tiles, pid_n)
        w_ptr, s_ptr = tl.where(second, w2_ptr, w_ptr), tl.where(second, s2_ptr, s_ptr)
        out_ptr, part_ptr = tl.where(second, out2_ptr, out_ptr), tl.where(second, part2_ptr, part_ptr)
        out_stride_m = tl.where(second, n2_size, out_stride_m)  # one group: out_stride_g multiplies 0
        out_size, s_stride = tl.where(second, out2_size, out_size), tl.where(second, s2_stride, s_stride)
        n_size = tl.where(second, n2_size, n_size)
    if IN_PROGRAM:
        g, split = pid_gs, 0
    else:
        g, split = pid_gs // SPLITS, pid_gs % SPLITS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = rows < m_size, n < n_size
    w_rows = (g * n_size + n).to(tl.int64)
    if PREFETCH:  # the weight is no kernel's output: its bytes may come before the wait
        last_row = (g * n_size + n_size - 1).to(tl.int64)
        starts = w_ptr + tl.minimum(w_rows, last_row) * K_SIZE + split * K_SPLIT
        NBYTES: tl.constexpr = PREFETCH if PREFETCH < K_SPLIT else K_SPLIT
        pdl_tl.prefetch_l2(starts, tl.full((BLOCK_N,), NBYTES, tl.int32))
    pdl_tl.enter(PDL)
    x_base = x_ptr + g * x_stride_g + rows[:, None] * x_stride_m
    if SWAPPED:
        zeros = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _k_range(zeros, x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, split * K_SPLIT, s_stride, K_SIZE,
                   K_SPLIT, W_FP8, X_MODE, SWAPPED, EMU_F32, EVEN_K, BLOCK_N, BLOCK_K, WIDE)  # fmt: skip
    if IN_PROGRAM:
        # the first range's sum is the total as it is (no add of a zero, which could turn -0 into +0)
        for s in range(1, SPLITS):
            part = _k_range(zeros, x_base, w_ptr, s_ptr, w_rows, m_mask, n_mask, s * K_SPLIT, s_stride,
                            K_SIZE, K_SPLIT, W_FP8, X_MODE, SWAPPED, EMU_F32, EVEN_K, BLOCK_N, BLOCK_K,
                            WIDE)  # fmt: skip
            acc = _add_sums(acc, part, EMU_F32)
    if SWAPPED:
        acc = tl.trans(acc)
    offs = g * out_stride_g + rows[:, None] * out_stride_m + n[None, :]
    store_tile(acc, out_ptr, part_ptr, count_ptr, offs, m_mask[:, None] & n_mask[None, :], split, out_size,
               1 if IN_PROGRAM else SPLITS)  # fmt: skip


def qdq_rows(x: Tensor) -> Tensor:
    """x [M, G, K] contiguous (K a multiple of 32) -> its FP8-g32 qdq, bf16 [M, G, K] (the MoE's pass)."""
    from dsgraph.platform.cuda.kernels.moe_swap_tl import launch_qdq_rows

    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    if x.numel():
        launch_qdq_rows(x.reshape(-1, x.shape[2]), y.view(-1, x.shape[2]))
    return y


def dequant_weight(w: Tensor, scale: Tensor) -> Tensor:
    """E4M3 W [R, K] and its UE8M0 bytes [ceil(R/32), ceil(K/32)] -> bf16 [R, K] (exact values)."""
    out = torch.empty(w.shape, dtype=torch.bfloat16, device=w.device)
    grid = (triton.cdiv(w.shape[0], DEQUANT_BLOCK), triton.cdiv(w.shape[1], DEQUANT_BLOCK))
    dequant_weight_kernel[grid](
        w, scale, out, w.shape[0], w.shape[1], scale.stride(0), BLOCK=DEQUANT_BLOCK, **pdl.launch()
    )
    return out


def x_mode(x: Tensor) -> int:
    """The activation path for x: bf16 as is, or split into bf16 pieces."""
    return X_BF16 if x.dtype == torch.bfloat16 else X_SPLIT


# FP32 accumulator registers per thread that a tile may hold twice (the total and the current range):
# a 128 x 128 tile on 8 warps holds 64 (sm_90: 205 registers, no spills; 128 on 4 warps spills)
IN_PROGRAM_ACC_REGS = 64


def sums_in_program(tiles: tuple) -> bool:
    """Whether a split weight's K ranges are summed in one program with these tiles: the plain tiles
    (prefill: its many row tiles fill the GPU) whose two accumulators fit in registers; the swapped
    (decode) tiles give each range a program of its own, to fill the SMs."""
    block_m, block_n, _, num_warps, _, swapped = tiles[:6]
    return not swapped and block_m * block_n // (32 * num_warps) <= IN_PROGRAM_ACC_REGS


def launch(
    x: Tensor, w: Tensor, scale: Tensor, out: Tensor, quantize: bool, tiles: tuple, splits: int,
    in_program: bool | None = None,
) -> None:  # fmt: skip
    """x [M, G, K] (unit stride along K), w [G*N, K] E4M3 with its UE8M0 scale bytes, out [M, G, N]
    contiguous; quantize: the op's FP8-g32 activation codec; tiles (BLOCK_M, BLOCK_N, BLOCK_K, warps,
    stages, swapped). Swapped tiles dequantize the weight in registers; the others prepare both operands
    in bf16 first (same values, same dots: the same bits). in_program: the K ranges of a split summed in
    one program (default: for the plain tiles) or by a program each (the bits are the same)."""
    launch_weights(x, ((w, scale, out),), quantize, tiles, splits, in_program)


def launch_weights(
    x: Tensor, weights: tuple[tuple[Tensor, Tensor, Tensor], ...], quantize: bool, tiles: tuple, splits: int,
    in_program: bool | None = None,
) -> None:  # fmt: skip
    """`launch` for one (w, scale, out), or for two read by the same x [M, 1, K] in one launch (a pair:
    one group, the same K splits; each out [M, 1, N_i] gets the bits of a launch of its own)."""
    from dsgraph.platform.cuda.kernels.linear_tl import split_buffers

    m_size, groups, k_size = x.shape
    block_m, block_n, block_k, num_warps, num_stages, swapped, wide = tiles[:7]
    if splits > 1 and k_size % (block_k * splits):
        raise ValueError(f"linear: K = {k_size} is not a multiple of BLOCK_K ({block_k}) x {splits} splits")
    if len(weights) not in (1, 2) or (len(weights) == 2 and groups != 1):
        raise ValueError(f"linear: one weight, or a pair over one group; got {len(weights)} over {groups}")
    if quantize:
        # once per call, not in the GEMM: every program would repeat the same rows' codec
        x = qdq_rows(x)
    mode = x_mode(x)
    if not swapped:
        weights = tuple((dequant_weight(w, scale), scale, out) for w, scale, out in weights)
    if in_program is None:
        in_program = sums_in_program(tiles)
    programs = 1 if in_program else splits  # per group along the grid's third axis
    tiles_n = sum(triton.cdiv(out.shape[2], block_n) for _, _, out in weights)
    grid = (tiles_n, triton.cdiv(m_size, block_m), groups * programs)
    (w, scale, out), (w2, scale2, out2) = weights[0], weights[-1]
    part, counts = split_buffers(out, programs, grid)
    part2 = split_buffers(out2, programs, grid)[0] if len(weights) == 2 else part
    pdl_args = pdl.launch()
    gemm_kernel[grid](
        x, w, scale, out, part, counts, m_size, out.shape[2], x.stride(0), x.stride(1), out.stride(0),
        out.stride(1), out.numel(), scale.stride(0), w2, scale2, out2, part2, out2.shape[2], out2.numel(),
        scale2.stride(0), K_SIZE=k_size, K_SPLIT=k_size // splits,
        W_FP8=bool(swapped), X_MODE=mode, SWAPPED=bool(swapped), EMU_F32=not x.is_cuda,
        EVEN_K=(k_size // splits) % block_k == 0, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        WIDE=bool(swapped and wide and mode != X_SPLIT), IN_PROGRAM=in_program, PAIR=len(weights) == 2,
        PREFETCH=_prefetch(k_size // splits, weights) if swapped else 0,
        num_warps=num_warps, num_stages=num_stages, **pdl_args,
    )  # fmt: skip


def _prefetch(k_split: int, weights: tuple[tuple[Tensor, Tensor, Tensor], ...]) -> int:
    """Bytes per weight row (E4M3: a byte per column) the programs prefetch: pdl.prefetch_bytes(), where
    bulk copies can take them (16-byte aligned starts and sizes), else 0."""
    aligned = k_split % 16 == 0
    aligned &= all(w.data_ptr() % 16 == 0 and w.shape[1] % 16 == 0 for w, _, _ in weights)
    return pdl.prefetch_bytes() // 16 * 16 if aligned else 0
