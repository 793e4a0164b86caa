"""CUDA rules of `linear` and `grouped_linear`: Triton GEMMs, one arithmetic per weight format.

Serving numerics (ops/nn.py, platform/cpu/rules_core.py): `fp8_block32` weights are E4M3 with one UE8M0
scale per 32x32 block; `act_quant fp8_g32` quantizes each activation row per 32 columns to E4M3 with a
UE8M0 scale (the cpu codec's exact rounding). Both give operand values that are exact in bf16, so FP8
weights run as exact bf16 operands into bf16 tensor-core dots with one chained FP32 accumulator
(linear_bf16_tl.py; f32/f16 activations of `act_quant none` are split exactly into three bf16 pieces).
Decode batches (M <= SWAP_MAX_ROWS) use the swapped kernel (weight dequantized in registers, activations
quantized in the kernel); larger M prepare bf16 operands once and run the plain tile. Both give a row
the same bits, so results do not depend on the batch.
The V4.1 graphs quantize a GEMM input with its own `act_qdq` (bf16 out, shared by the linears that read
one activation) and run these linears with act_quant none: the same values into the same GEMM, once.
Dense weights (the router gate, the head) run linear_tl.py's kernel: dots in the common dtype of x and
w (FP32 IEEE when they differ), accumulated per 32-column chunk. Dense weights with act_quant fp8_g32 (no
V4.1 graph uses it) and tensors not on a CUDA device (unless Triton's interpreter is on) fall back to
the cpu rule. K is cut into ranges (summed apart, then added in order) by the weight's shape alone
(`k_splits`), the same for every M. `linear_pair` (two FP8 linears of one activation, ops/fused.py) runs
both weights' tiles in one GEMM launch where their K splits agree, each output with its own launch's
bits.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from dsgraph.platform import env
from dsgraph.platform.cpu import rules_core, rules_quant
from dsgraph.platform.cpu.dtypes import to_torch

__all__ = [
    "DENSE_TILE_TABLE",
    "RULES",
    "TILE_TABLE",
    "Tiles",
    "dense_pair",
    "dot_kind",
    "grouped_linear",
    "k_splits",
    "linear",
    "tiles_for",
]


class Tiles(NamedTuple):
    """One launch configuration. block_k is a multiple of 32 (the scale block). swapped (FP8 weights
    only): the tile is out^T with block_n weight rows on the tensor core's 64-row side (a multiple of 64
    per warpgroup) and block_m activation rows (16 or more). wide (swapped only): each BLOCK_K step is
    loaded and dequantized at once and dotted once, instead of 32 columns (one scale block) at a time:
    the same tensor-core steps in the same order, so the same bits, with more bytes in flight (split
    f32 activations keep the chunks, whose dots interleave the pieces per chunk)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    swapped: bool = False
    wide: bool = False


# FP8 weights: (largest M, tiles), M increasing; the last entry serves every larger M. Chosen by the
# time of one layer's linears in tools/bench/linear_sweep.py (results under bench/results/): decode
# streams the weights once, so the swapped tiles keep the activation tile small (16 rows) and many
# programs per SM; from 257 rows the weights are dequantized once per call.
TILE_TABLE: tuple[tuple[int, Tiles], ...] = (
    (16, Tiles(16, 64, 256, 4, 3, True, True)),
    (256, Tiles(64, 128, 32, 8, 4, True)),
    (1 << 62, Tiles(128, 128, 64, 8, 3)),
)

# Dense weights (linear_tl.py): block_m stays 64 in every class so every class uses the same (wgmma)
# tensor-core instruction shape per output element (tests/cuda/test_linear.py checks bit equality).
DENSE_TILE_TABLE: tuple[tuple[int, Tiles], ...] = (
    (16, Tiles(64, 32, 128, 4, 4)),
    (64, Tiles(64, 64, 128, 4, 4)),
    (1 << 62, Tiles(128, 128, 32, 8, 4)),
)


# dense_pair's one launch: up to this many rows (the dense tiles of 64 rows; tests/cuda/hopper_compile.py
# compiles them without spills)
PAIR_MAX_ROWS = 64

# K splits: decode (M <= 16) has ceil(N / 32) programs per group, too few to fill 132 SMs for the narrow
# projections (72 for the shared experts' 2304 rows, 16 for the indexer's 512). K is cut into up to
# MAX_SPLITS ranges of a multiple of SPLIT_ALIGN columns until the decode grid has SPLIT_TARGET programs;
# the count depends on the weight's shape only, never on M, so a row's bits stay batch invariant (every
# M runs the same splits, added in the same order).
SPLIT_TARGET = 264  # decode programs wanted (two per SM)
SPLIT_ALIGN = 256  # columns: a multiple of every BLOCK_K in the tile tables
MAX_SPLITS = 8
MIN_SPLIT = 512  # at least this many columns per split


SPLIT_TILE_N = 32  # weight rows per decode program, as the split count reckons it


def k_splits(groups: int, n_size: int, k_size: int) -> int:
    """How many K ranges a GEMM of this weight shape is cut into (1: none)."""
    programs = groups * -(-n_size // SPLIT_TILE_N)
    valid = [1] + [
        s for s in range(2, MAX_SPLITS + 1) if k_size % (SPLIT_ALIGN * s) == 0 and k_size // s >= MIN_SPLIT
    ]
    return next((s for s in valid if programs * s >= SPLIT_TARGET), valid[-1])


def tiles_for(m: int, dense: bool = False) -> Tiles:
    """The tiles for a GEMM of m rows: the first entry of the weight format's table whose bound is >= m.
    Every entry keeps each output element's K order (batch invariance: GPU-tested)."""
    table = DENSE_TILE_TABLE if dense else TILE_TABLE
    return next((tiles for bound, tiles in table if m <= bound), table[-1][1])


def _uses_kernel(p: Any, x: Tensor) -> bool:
    if p.weight_format == "dense" and p.act_quant != "none":
        return False
    if p.act_quant == "fp8_g32" and x.shape[-1] % 32:
        return False  # the codec quantizes whole 32-column groups
    return x.is_cuda or env.triton_interpreting()


def dot_kind(act_quant: str, x: Tensor, dense_weight: Tensor | None) -> int:
    """linear_tl's DOT_* for activations x and a dense weight (None: an FP8 or FP4 weight, which converts
    exactly to any float dtype)."""
    from dsgraph.platform.cuda.kernels import linear_tl

    if act_quant == "fp8_g32":
        return linear_tl.DOT_FP8
    # Triton 3.6's interpreter multiplies bf16 dot operands as raw integers; off the GPU a bf16 dot runs
    # as an FP32 one, which gives the same products (bf16 x bf16 is exact in FP32).
    native = (torch.bfloat16, torch.float16) if x.is_cuda else (torch.float16,)
    if x.dtype in native and (dense_weight is None or dense_weight.dtype == x.dtype):
        return linear_tl.DOT_NATIVE
    if dense_weight is None:
        return linear_tl.DOT_SPLIT if x.is_cuda else linear_tl.DOT_SPLIT_F32
    return linear_tl.DOT_F32 if x.is_cuda else linear_tl.DOT_F64


def _run(
    p: Any, x3: Tensor, w: Tensor, scale: tuple[Tensor, ...], n_size: int, tiles: Tiles | None = None
) -> Tensor:
    """x3 [M, G, K] -> [M, G, N] in out_dtype through the Triton kernel (tiles: by M unless given)."""
    from dsgraph.platform.cuda.kernels import linear_tl

    x3 = x3.contiguous()
    out = torch.empty((x3.shape[0], x3.shape[1], n_size), dtype=to_torch(p.out_dtype), device=x3.device)
    if out.numel() == 0:
        return out.zero_()
    scale_bytes = scale[0].contiguous().view(torch.uint8) if scale else None
    splits = k_splits(x3.shape[1], n_size, x3.shape[2])
    dense = p.weight_format == "dense"
    tiles = tiles or tiles_for(x3.shape[0], dense)
    if dense:
        linear_tl.launch(x3, w.contiguous(), None, out, dot_kind(p.act_quant, x3, w), tiles, splits)
    else:
        from dsgraph.platform.cuda.kernels import linear_bf16_tl

        quantize = p.act_quant == "fp8_g32"
        linear_bf16_tl.launch(x3, w.contiguous(), scale_bytes, out, quantize, tiles, splits)
    return out


def linear(p: Any, x: Tensor, w: Tensor, *scale: Tensor, tiles: Tiles | None = None) -> Tensor:
    """`x [*, k] @ w^T` (see ops/nn.py `linear`); tiles: by the row count unless given (sweeps, tests)."""
    if not _uses_kernel(p, x):
        return rules_core.linear(p, x, w, *scale)
    lead = x.shape[:-1]
    out = _run(p, x.reshape(-1, 1, x.shape[-1]), w, scale, w.shape[0], tiles)
    return out.reshape(*lead, w.shape[0])


def grouped_linear(p: Any, x: Tensor, w: Tensor, *scale: Tensor, tiles: Tiles | None = None) -> Tensor:
    """`x [*, G, k]`, group g against rows g*n .. (g+1)*n - 1 of w (see ops/nn.py `grouped_linear`)."""
    if not _uses_kernel(p, x):
        return rules_quant.grouped_linear(p, x, w, *scale)
    lead, groups = x.shape[:-2], x.shape[-2]
    n_size = w.shape[0] // groups
    out = _run(p, x.reshape(-1, groups, x.shape[-1]), w, scale, n_size, tiles)
    return out.reshape(*lead, groups, n_size)


def dense_pair(p: Any, x: Tensor, w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor]:
    """Two dense linears of one activation x [M, K] (a compressor's wkv and wgate): one launch of the dense
    kernel when both weights have one dtype and take the same K splits (each output then has its own
    launch's bits), for up to PAIR_MAX_ROWS rows (the large tile's pair spills registers on sm_90, and a
    prefill chunk's launch count does not matter); else a launch each."""
    k_size = x.shape[-1]
    one = p.weight_format == "dense" and _uses_kernel(p, x) and w1.dtype == w2.dtype and x.dim() == 2
    one = one and x.shape[0] <= PAIR_MAX_ROWS
    if not one or k_splits(1, w1.shape[0], k_size) != k_splits(1, w2.shape[0], k_size):
        return linear(p, x, w1), linear(p, x, w2)
    from dsgraph.platform.cuda.kernels import linear_tl

    x3 = x.reshape(-1, 1, k_size).contiguous()
    outs = [
        torch.empty((x3.shape[0], 1, w.shape[0]), dtype=to_torch(p.out_dtype), device=x.device)
        for w in (w1, w2)
    ]
    if x3.shape[0]:
        weights = ((w1.contiguous(), outs[0]), (w2.contiguous(), outs[1]))
        tiles = tiles_for(x3.shape[0], dense=True)
        kind = dot_kind(p.act_quant, x3, w1)
        linear_tl.launch_weights(x3, weights, None, kind, tiles, k_splits(1, w1.shape[0], k_size))
    return outs[0].reshape(-1, w1.shape[0]), outs[1].reshape(-1, w2.shape[0])


def _one_launch(p: Any, x: Tensor, w1: Tensor, w2: Tensor) -> bool:
    """Whether linear_pair's two FP8 GEMMs run as one launch: the kernel applies and both weights take
    the same K splits (each output then gets its own launch's bits; the op's shape rule gave both x's K)."""
    if p.weight_format != "fp8_block32" or not _uses_kernel(p, x):
        return False
    return k_splits(1, w1.shape[0], x.shape[-1]) == k_splits(1, w2.shape[0], x.shape[-1])


def linear_pair(p: Any, x: Tensor, w1: Tensor, s1: Tensor, w2: Tensor, s2: Tensor) -> tuple[Tensor, Tensor]:
    """Two FP8 linears of one activation (ops/fused.py) in one GEMM launch; else one launch each."""
    if not _one_launch(p, x, w1, w2):
        return linear(p, x, w1, s1), linear(p, x, w2, s2)
    from dsgraph.platform.cuda.kernels import linear_bf16_tl

    lead, k_size = x.shape[:-1], x.shape[-1]
    x3 = x.reshape(-1, 1, k_size).contiguous()
    outs = [
        torch.empty((x3.shape[0], 1, w.shape[0]), dtype=to_torch(p.out_dtype), device=x.device)
        for w in (w1, w2)
    ]
    if x3.shape[0]:
        weights = tuple(
            (w.contiguous(), s.contiguous().view(torch.uint8), out)
            for w, s, out in zip((w1, w2), (s1, s2), outs, strict=True)
        )
        splits = k_splits(1, w1.shape[0], k_size)
        tiles = tiles_for(x3.shape[0])
        linear_bf16_tl.launch_weights(x3, weights, p.act_quant == "fp8_g32", tiles, splits)
    return outs[0].reshape(*lead, w1.shape[0]), outs[1].reshape(*lead, w2.shape[0])


RULES: dict[str, Any] = {"linear": linear, "grouped_linear": grouped_linear, "linear_pair": linear_pair}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them): for FP8
# weights the operand passes of the plain tile, the GEMM and the reduction of its K splits; for dense
# weights linear_tl's GEMM
_LINEAR_KERNELS = (
    "moe_swap_tl.qdq_rows_kernel",
    "linear_bf16_tl.dequant_weight_kernel",
    "linear_bf16_tl.gemm_kernel",
    "linear_tl.linear_kernel",
)
KERNELS: dict[str, tuple[str, ...]] = {
    "linear": _LINEAR_KERNELS,
    "grouped_linear": _LINEAR_KERNELS,
    "linear_pair": _LINEAR_KERNELS,
}
