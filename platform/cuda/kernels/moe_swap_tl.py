"""The "swap" expert GEMMs of `moe_experts` (rules in moe.py, which imports this lazily): out^T = W . a^T.

The expert's weight rows sit on the tensor-core dot's M side (BLOCK_W of them) and the tile's sorted rows
(tokens, or pairs for w2) on its N side (BLOCK_T, 16 at decode): a decode tile has no M padding, and one
expert's weight matrix is split over N_SIZE / BLOCK_W programs that stream it once. The packed MXFP4
weights are dequantized in registers to BF16 (E2M1 value x UE8M0 scale is exact in BF16; it is not in
E4M3 once the scale leaves [2^-8, 2^6]), so they are the dot's register operand and the activation tile
the shared-memory one. The activation is what the cpu rule's GEMM reads, already rounded to BF16 exactly:
x FP8-g32 qdq'd by `qdq_rows_kernel` (FP8 value x power-of-two scale is exact in BF16), or BF16 x as is.
Each dot runs over BLOCK_K columns into one FP32 accumulator (products exact, FP32 sums, K in increasing
order): a row's result depends only on that row and on BLOCK_K, never on the tile's other rows, so the
row-side tile BLOCK_T may follow the step's row count (moe.py) without changing a bit.
The gated kernel fuses w1 and w3, the gemm_out rounding, the clamped SwiGLU, the routing weight and the
w2 GEMM's input rounding (FP8-g32 qdq, or rounding to the activation dtype) and writes that BF16 input;
the down kernel writes each pair's w2 output rounded to gemm_out. Under Triton's interpreter, whose BF16
dot is wrong, the same values are dotted in FP32 (WIDE): the same exact products.
Decode is bound by the instructions that turn packed codes into BF16 operands, so _dequantize reads the
weights as int32 words (eight codes each) and places each code's bits straight into an FP32 (a mask, a
multiply, a mask; no compare or select), then scales it with two exact power-of-two multiplies.
SCALED (the tile set's choice, never under WIDE: the interpreter has no dot_scaled) hands the packed bytes and
their scales to `tl.dot_scaled` instead: Triton upcasts E2M1 x UE8M0 to BF16 itself (the same exact
values through its own packed conversion) and runs the same BF16 dot with FP32 accumulation; its weight
loads are staged in shared memory by the pipeliner, num_stages deep.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_tl import (
    E2M1_PAIRS_ASM,
    E2M1_PAIRS_ASM_ONE,
    bf16_halves,
    fp8_g32_grid,
    round_f32_to,
    swiglu_f32,
)


@triton.jit
def _load_packed(w_base, s_base, n, n_mask, k0, K_SIZE: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN: tl.constexpr, WORDS: tl.constexpr):  # fmt: skip
    """W[n, k0 : k0 + BLOCK_K] packed, raw: the bytes [BLOCK_W, BLOCK_K // 2], or with WORDS the int32
    words [BLOCK_W, BLOCK_K // 8] (eight codes each, the lowest nibble first), and their UE8M0 scales
    (past N or K: zeros). EVEN (BLOCK_W divides N, BLOCK_K divides K): no masks, so the loads are
    vectorized."""
    PER: tl.constexpr = 8 if WORDS else 2  # codes per loaded element
    if WORDS:
        w_base = w_base.to(tl.pointer_type(tl.uint32))
    col = k0 // PER + tl.arange(0, BLOCK_K // PER)
    group = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    w_ptrs = w_base + n[:, None] * (K_SIZE // PER) + col[None, :]
    s_ptrs = s_base + n[:, None] * (K_SIZE // 32) + group[None, :]
    if EVEN:
        b = tl.load(w_ptrs)
        s = tl.load(s_ptrs)
    else:
        b = tl.load(w_ptrs, mask=n_mask[:, None] & (col[None, :] < K_SIZE // PER), other=0)
        s = tl.load(s_ptrs, mask=n_mask[:, None] & (group[None, :] < K_SIZE // 32), other=127)
    return b, s


@triton.jit
def _scale_factors(s):
    """UE8M0 bytes -> (f1, f2), FP32 powers of two with f1 * f2 = 2^126 x 2^(s-127): f1 = 2^(min(s,128)-1)
    (a normal FP32 for every byte) and f2 = 2^(max(s,128)-128) (NaN for byte 255, as e8m0_to_f32)."""
    s = s.to(tl.int32) & 0xFF
    f1 = ((tl.minimum(s, 128) + 126) << 23).to(tl.float32, bitcast=True)
    f2 = tl.where(s == 255, 0x7FC00000, (tl.maximum(s, 128) - 1) << 23).to(tl.float32, bitcast=True)
    return f1, f2


@triton.jit
def _code_f32(words, SHIFT: tl.constexpr):
    """The E2M1 code in bits SHIFT .. SHIFT + 3 of int32 words as the FP32 with its sign (code bit 3) at bit
    31 and its magnitude (bits 0..2) at bits 22..24: that FP32 is the code's value times 2^-126 exactly
    (magnitudes 0 and 1 land on the subnormals 0 and 2^-127, the others on normals). One multiply places
    both fields: the masked code (at bit P) times 2^(22-P) + 2^(28-P) holds two copies of it, at bits
    22..25 and 28..31, which do not overlap, so the product is their OR. Codes above bit 23 are moved
    down 8 bits first (the arithmetic shift's sign copies are masked off)."""
    if SHIFT > 20:
        code = (words >> 8) & (0xF << (SHIFT - 8))
        factor: tl.constexpr = (1 << (30 - SHIFT)) + (1 << (36 - SHIFT))
    else:
        code = words & (0xF << SHIFT)
        factor: tl.constexpr = (1 << (22 - SHIFT)) + (1 << (28 - SHIFT))
    return ((code * factor) & 0x81C00000).to(tl.float32, bitcast=True)


@triton.jit
def _scaled_code(words, f1, f2, SHIFT: tl.constexpr):
    """Code value x 2^(s-127): two exact power-of-two multiplies of _code_f32; + 0.0 turns code 8's -0 into
    +0 like the cpu dequantizer."""
    return _code_f32(words, SHIFT) * f1 * f2 + 0.0


@triton.jit
def _dequantize(words, s, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, WIDE: tl.constexpr):
    """Packed int32 words and scales (from _load_packed with WORDS) -> [BLOCK_W, BLOCK_K] BF16 values
    (FP32 when WIDE): per code a mask, a multiply, a mask and two multiplies, every step exact."""
    words = tl.reshape(words, (BLOCK_W, BLOCK_K // 32, 4))  # a 32-column scale group is 4 words
    f1, f2 = _scale_factors(s)
    f1, f2 = f1[:, :, None], f2[:, :, None]
    # code c of a word is column 8 x word + c; tl.join adds its axis last, so the outermost join is the
    # fastest axis: codes c = 4x + 2y + z sit at [x, y, z] when joined over x first, then y, then z
    even = tl.join(
        tl.join(_scaled_code(words, f1, f2, 0), _scaled_code(words, f1, f2, 16)),
        tl.join(_scaled_code(words, f1, f2, 8), _scaled_code(words, f1, f2, 24)),
    )
    odd = tl.join(
        tl.join(_scaled_code(words, f1, f2, 4), _scaled_code(words, f1, f2, 20)),
        tl.join(_scaled_code(words, f1, f2, 12), _scaled_code(words, f1, f2, 28)),
    )
    w = tl.reshape(tl.join(even, odd), (BLOCK_W, BLOCK_K))
    if not WIDE:
        w = w.to(tl.bfloat16)
    return w


@triton.jit
def _asm_scales(s, ONE: tl.constexpr):
    """UE8M0 bytes -> the scale pairs of E2M1_PAIRS_ASM(_ONE) as BF16 bits twice: ONE: 2^(s-1), exponent
    field s + 126 (s <= 128); else 2^(s-127), exponent field s except for byte 0 (2^-127, a subnormal)
    and 255 (NaN)."""
    s = s.to(tl.int32) & 0xFF
    if ONE:
        f = s * 0x00800080 + 0x3F003F00
    else:
        f = tl.where(s == 0, 0x00400040, tl.where(s == 255, 0x7FC07FC0, s * 0x00800080))
    return f


@triton.jit
def _dequantize_asm(b, s, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, ONE: tl.constexpr):
    """Packed bytes [BLOCK_W, BLOCK_K // 2] and UE8M0 scales [BLOCK_W, BLOCK_K // 32] -> [BLOCK_W, BLOCK_K]
    BF16 through E2M1_PAIRS_ASM (four bytes and their four scales per call); ONE only where every scale
    byte of the weights is at most 128 (the launch's ONE: moe.py checks the scales once per tensor)."""
    f = _asm_scales(s, ONE)
    f = tl.reshape(tl.broadcast_to(f[:, :, None], (BLOCK_W, BLOCK_K // 32, 16)), (BLOCK_W, BLOCK_K // 2))
    if ONE:
        pairs = tl.inline_asm_elementwise(
            E2M1_PAIRS_ASM_ONE, "=r,=r,=r,=r,r,r,r,r,r", [b, f], dtype=tl.int32, is_pure=True, pack=4
        )
    else:
        pairs = tl.inline_asm_elementwise(
            E2M1_PAIRS_ASM, "=r,=r,=r,=r,r,r,r,r,r", [b, f], dtype=tl.int32, is_pure=True, pack=4
        )
    # the halves of one register: the compiler hands the register to the dot as it is
    lo, hi = bf16_halves(pairs)
    return tl.reshape(tl.join(lo, hi), (BLOCK_W, BLOCK_K))


@triton.jit
def _dot_packed(b, s, a, acc, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, WIDE: tl.constexpr,
                SCALED: tl.constexpr, ASM: tl.constexpr = False, ONE: tl.constexpr = False):  # fmt: skip
    """acc + W . a for W the packed bytes b and scales s (from _load_packed): BF16 dot, FP32 sums."""
    if ASM:
        w = _dequantize_asm(b, s, BLOCK_W, BLOCK_K, ONE)
        acc = tl.dot(w, a, acc, input_precision="ieee", out_dtype=tl.float32)
    elif SCALED:
        packed = b.to(tl.uint8, bitcast=True)  # the weights are stored as int8
        acc = tl.dot_scaled(packed, s, "e2m1", a, None, "bf16", acc, out_dtype=tl.float32)
    else:
        w = _dequantize(b, s, BLOCK_W, BLOCK_K, WIDE)
        acc = tl.dot(w, a, acc, input_precision="ieee", out_dtype=tl.float32)
    return acc


@triton.jit
def _qdq_columns(act, BLOCK_W: tl.constexpr, BLOCK_T: tl.constexpr):
    """act [BLOCK_W, BLOCK_T] FP32, each column one row's BLOCK_W consecutive values: FP8-g32 qdq along
    BLOCK_W (the cpu rule's fp8_g32_qdq of the w2 input), as FP32."""
    groups = tl.reshape(tl.trans(act), (BLOCK_T * (BLOCK_W // 32), 32))
    values, scale = fp8_g32_grid(groups)
    return tl.trans(tl.reshape(values * scale[:, None], (BLOCK_T, BLOCK_W)))


@triton.jit
def _load_act(a_ptr, a_rows, row_mask, a_stride, k0, K_SIZE: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN: tl.constexpr, WIDE: tl.constexpr):  # fmt: skip
    """The activation tile [BLOCK_K, BLOCK_T]: columns k0 .. k0 + BLOCK_K of rows a_rows (zeros past the
    rows or K), FP32 when WIDE."""
    cols = k0 + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[None, :] * a_stride + cols[:, None]
    if EVEN:
        a = tl.load(a_ptrs, mask=row_mask[None, :], other=0.0)
    else:
        a = tl.load(a_ptrs, mask=row_mask[None, :] & (cols[:, None] < K_SIZE), other=0.0)
    if WIDE:
        a = a.to(tl.float32)
    return a


@triton.jit
def _gated(g, acc_v, route, limit, GEMM_DTYPE: tl.constexpr, QDQ_OUT: tl.constexpr, BLOCK_W: tl.constexpr,
           BLOCK_T: tl.constexpr):  # fmt: skip
    """The gated epilogue: w1 output g (rounded to gemm_out) and w3 accumulator -> the clamped SwiGLU
    times the routing weight, FP8-g32 qdq'd along the weight rows when QDQ_OUT (the w2 input)."""
    out = swiglu_f32(g, round_f32_to(acc_v, GEMM_DTYPE).to(tl.float32), limit) * route[None, :]
    if QDQ_OUT:
        out = _qdq_columns(out, BLOCK_W, BLOCK_T)
    return out


@triton.jit
def _streamed_dots(a_ptr, a_rows, row_mask, a_stride, w_base, s_base, v_base, vs_base, n, n_mask,
                   K_SIZE: tl.constexpr, GATED: tl.constexpr, WIDE: tl.constexpr, BLOCK_W: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr, SCALED: tl.constexpr,
                   ASM: tl.constexpr, ONE: tl.constexpr = False):  # fmt: skip
    """(W . a^T, V . a^T) over K with the loads of the current chunk only: the packed bytes reach the
    upcast (dot_scaled's, or the inline PTX) from shared memory, so Triton's pipeliner stages them
    num_stages - 1 chunks ahead with async copies (more bytes in flight than a register prefetch)."""
    acc = tl.zeros((BLOCK_W, BLOCK_T), dtype=tl.float32)
    acc_v = tl.zeros((BLOCK_W, BLOCK_T), dtype=tl.float32)
    for k0 in range(0, K_SIZE, BLOCK_K):
        a = _load_act(a_ptr, a_rows, row_mask, a_stride, k0, K_SIZE, BLOCK_K, EVEN, WIDE)
        wb, ws = _load_packed(w_base, s_base, n, n_mask, k0, K_SIZE, BLOCK_K, EVEN, False)
        acc = _dot_packed(wb, ws, a, acc, BLOCK_W, BLOCK_K, WIDE, SCALED, ASM, ONE)
        if GATED:
            vb, vs = _load_packed(v_base, vs_base, n, n_mask, k0, K_SIZE, BLOCK_K, EVEN, False)
            acc_v = _dot_packed(vb, vs, a, acc_v, BLOCK_W, BLOCK_K, WIDE, SCALED, ASM, ONE)
    return acc, acc_v


@triton.jit
def _prefetched_dots(a_ptr, a_rows, row_mask, a_stride, w_base, s_base, v_base, vs_base, n, n_mask,
                     K_SIZE: tl.constexpr, GATED: tl.constexpr, WIDE: tl.constexpr, BLOCK_W: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """(W . a^T, V . a^T) over K through the kernel's own dequantization, which sits between load and
    dot, so the pipeliner cannot stage the weights: the words of the next chunk are loaded before this
    chunk's dots (a register prefetch, in flight while the dots wait)."""
    acc = tl.zeros((BLOCK_W, BLOCK_T), dtype=tl.float32)
    acc_v = tl.zeros((BLOCK_W, BLOCK_T), dtype=tl.float32)
    wb, ws = _load_packed(w_base, s_base, n, n_mask, 0, K_SIZE, BLOCK_K, EVEN, True)
    vb, vs = wb, ws
    if GATED:
        vb, vs = _load_packed(v_base, vs_base, n, n_mask, 0, K_SIZE, BLOCK_K, EVEN, True)
    for k0 in range(0, K_SIZE, BLOCK_K):
        a = _load_act(a_ptr, a_rows, row_mask, a_stride, k0, K_SIZE, BLOCK_K, EVEN, WIDE)
        # the last chunk prefetches chunk 0 again (in bounds, and in cache) rather than masking
        k_next = tl.multiple_of((k0 + BLOCK_K) % K_SIZE, BLOCK_K)
        acc = _dot_packed(wb, ws, a, acc, BLOCK_W, BLOCK_K, WIDE, False)
        wb, ws = _load_packed(w_base, s_base, n, n_mask, k_next, K_SIZE, BLOCK_K, EVEN, True)
        if GATED:
            acc_v = _dot_packed(vb, vs, a, acc_v, BLOCK_W, BLOCK_K, WIDE, False)
            vb, vs = _load_packed(v_base, vs_base, n, n_mask, k_next, K_SIZE, BLOCK_K, EVEN, True)
    return acc, acc_v


@triton.jit
def _token_dots(a_ptr, a_rows, row_mask, a_stride, w_base, s_base, v_base, vs_base, n, n_mask,
                K_SIZE: tl.constexpr, GATED: tl.constexpr, WIDE: tl.constexpr, BLOCK_W: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """(W . a^T, V . a^T) as [BLOCK_W, BLOCK_T], computed as a . W^T (TOKENS): the sorted rows on the dot's
    M side and the dequantized weights as its shared-memory operand, which every warp of the program
    reads, so one upcast of a weight tile serves BLOCK_T rows (the swap dots' register operand serves
    its own warpgroup's). The same products summed in the same K order."""
    acc = tl.zeros((BLOCK_T, BLOCK_W), dtype=tl.float32)
    acc_v = tl.zeros((BLOCK_T, BLOCK_W), dtype=tl.float32)
    for k0 in range(0, K_SIZE, BLOCK_K):
        a = tl.trans(_load_act(a_ptr, a_rows, row_mask, a_stride, k0, K_SIZE, BLOCK_K, EVEN, WIDE))
        wb, ws = _load_packed(w_base, s_base, n, n_mask, k0, K_SIZE, BLOCK_K, EVEN, True)
        w = tl.trans(_dequantize(wb, ws, BLOCK_W, BLOCK_K, WIDE))
        acc = tl.dot(a, w, acc, input_precision="ieee", out_dtype=tl.float32)
        if GATED:
            vb, vs = _load_packed(v_base, vs_base, n, n_mask, k0, K_SIZE, BLOCK_K, EVEN, True)
            v = tl.trans(_dequantize(vb, vs, BLOCK_W, BLOCK_K, WIDE))
            acc_v = tl.dot(a, v, acc_v, input_precision="ieee", out_dtype=tl.float32)
    return tl.trans(acc), tl.trans(acc_v)


@triton.jit
def swap_gemm_kernel(
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
    GATED: tl.constexpr,
    QDQ_OUT: tl.constexpr,
    GEMM_DTYPE: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN: tl.constexpr,
    SCALED: tl.constexpr = False,
    ASM: tl.constexpr = False,
    ONE: tl.constexpr = False,
    TOKENS: tl.constexpr = False,
    PDL: tl.constexpr = False,
) -> None:
    """Program (weight-row tile, row tile): out[r, n] for the tile's sorted rows r and weight rows n.
    GATED: A row token[r] of a (x), two weights (w1, w3); else row r of a (the w2 input), one weight."""
    pdl_tl.enter(PDL)
    tile = tl.program_id(1)
    e = tl.load(tile_expert_ptr + tile)
    if e < num_experts:
        rows = tl.load(tile_start_ptr + tile) + tl.arange(0, BLOCK_T)
        row_mask = rows < tl.load(tile_end_ptr + tile)
        if GATED:
            a_rows = tl.load(a_rows_ptr + rows, mask=row_mask, other=0).to(tl.int64)
        else:
            a_rows = rows.to(tl.int64)
        n = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
        n_mask = n < N_SIZE
        # int64 expert offsets: 384 experts x 2304 rows x 2560 bytes pass 2^31.
        w_offset = e.to(tl.int64) * N_SIZE * (K_SIZE // 2)
        s_offset = e.to(tl.int64) * N_SIZE * (K_SIZE // 32)
        w_base, s_base = w_ptr + w_offset, s_ptr + s_offset
        v_base, vs_base = v_ptr + w_offset, vs_ptr + s_offset
        if TOKENS:
            acc, acc_v = _token_dots(
                a_ptr, a_rows, row_mask, a_stride, w_base, s_base, v_base, vs_base, n, n_mask, K_SIZE,
                GATED, WIDE, BLOCK_W, BLOCK_T, BLOCK_K, EVEN,
            )  # fmt: skip
        elif SCALED or ASM:
            acc, acc_v = _streamed_dots(
                a_ptr, a_rows, row_mask, a_stride, w_base, s_base, v_base, vs_base, n, n_mask, K_SIZE,
                GATED, WIDE, BLOCK_W, BLOCK_T, BLOCK_K, EVEN, SCALED, ASM, ONE,
            )  # fmt: skip
        else:
            acc, acc_v = _prefetched_dots(
                a_ptr, a_rows, row_mask, a_stride, w_base, s_base, v_base, vs_base, n, n_mask, K_SIZE,
                GATED, WIDE, BLOCK_W, BLOCK_T, BLOCK_K, EVEN,
            )  # fmt: skip
        out = round_f32_to(acc, GEMM_DTYPE).to(tl.float32)
        if GATED:
            route = tl.load(route_ptr + rows, mask=row_mask, other=0.0)
            out = _gated(out, acc_v, route, limit, GEMM_DTYPE, QDQ_OUT, BLOCK_W, BLOCK_T)
        out_ptrs = out_ptr + rows[None, :].to(tl.int64) * N_SIZE + n[:, None]
        tl.store(
            out_ptrs, round_f32_to(out, out_ptr.dtype.element_ty), mask=row_mask[None, :] & n_mask[:, None]
        )


@triton.jit
def qdq_rows_kernel(
    x_ptr, out_ptr, num_rows, width, BLOCK_R: tl.constexpr, PDL: tl.constexpr = False
) -> None:
    """out = fp8_g32_qdq(x) (FP32 math, exact in out's BF16): grid (row blocks, 32-column groups)."""
    pdl_tl.enter(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    cols = tl.program_id(1) * 32 + tl.arange(0, 32)
    mask = rows[:, None] < num_rows
    x = tl.load(x_ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    values, scale = fp8_g32_grid(x)
    out = values * scale[:, None]
    tl.store(
        out_ptr + rows[:, None] * width + cols[None, :],
        round_f32_to(out, out_ptr.dtype.element_ty),
        mask=mask,
    )


def launch_qdq_rows(x: Tensor, out: Tensor) -> None:
    """x [rows, width] (width a multiple of 32) -> out [rows, width] = fp8_g32_qdq(x)."""
    rows, width = x.shape
    block_r = 32
    qdq_rows_kernel[(triton.cdiv(rows, block_r), width // 32)](
        x, out, rows, width, BLOCK_R=block_r, num_warps=4, **pdl.launch()
    )


def launch_swap_gemm(
    a: Tensor,
    a_rows: Tensor | None,
    weights: tuple[Tensor, Tensor, Tensor | None, Tensor | None],
    route: Tensor | None,
    tiles: tuple[Tensor, Tensor, Tensor],
    out: Tensor,
    limit: float,
    config: dict,
) -> None:
    """weights = (w, scale, v, v_scale): packed MXFP4 (uint8 scales), v None for w2; a_rows: the A row of
    each sorted row (gated only); tiles = (expert, start, end) per row tile; config: GEMM_DTYPE, QDQ_OUT,
    WIDE, BLOCK_W, BLOCK_T, BLOCK_K, num_warps, num_stages and optionally SCALED."""
    w, s, v, vs = weights
    n_size, k_size = w.shape[1], a.shape[1]
    # the word-wise dequantization reads the packed weights as int32 words
    for name, t in (("w", w), ("v", v)):
        if t is not None and not config.get("SCALED") and (t.data_ptr() % 4 or k_size % 32):
            raise ValueError(
                f"moe swap GEMM: packed weight {name} at address {t.data_ptr()} with K = {k_size}: "
                "expected 4-byte alignment and K a multiple of 32"
            )
    grid = (triton.cdiv(n_size, config["BLOCK_W"]), tiles[0].shape[0])
    swap_gemm_kernel[grid](
        a,
        a_rows if a_rows is not None else tiles[0],
        w,
        s,
        v if v is not None else w,
        vs if vs is not None else s,
        route if route is not None else tiles[0],
        *tiles,
        out,
        w.shape[0],
        a.stride(0),
        limit,
        N_SIZE=n_size,
        K_SIZE=k_size,
        GATED=v is not None,
        EVEN=n_size % config["BLOCK_W"] == 0 and k_size % config["BLOCK_K"] == 0,
        **config,
        **pdl.launch(),
    )
