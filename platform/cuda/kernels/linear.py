"""CUDA rules of `linear` and `grouped_linear`: one Triton GEMM (linear_tl.py) for every weight format.

Serving numerics (ops/nn.py, platform/cpu/rules_core.py): `fp8_block32` weights are E4M3 with one UE8M0
scale per 32x32 block; `act_quant fp8_g32` quantizes each activation row per 32 columns to E4M3 with a
UE8M0 scale. The kernel quantizes the activation tile in registers with the cpu codec's exact rounding
(quant_tl.py), runs E4M3 x E4M3 tensor-core dots 32 columns at a time and applies both scales to each
FP32 partial sum. Other combinations:
- fp8 weights, act_quant none: weights converted to x's dtype in registers (bf16/f16 dots, exact
  products); f32 x (wo_b after the FP8 qdq of wo_a's output) is split exactly into three bf16 pieces, so
  three bf16 dots give exact products summed in FP32;
- dense weights, act_quant none: dots in the common dtype of x and w (FP32 IEEE when they differ);
- dense weights with act_quant fp8_g32 (no V4.1 graph uses it) and tensors not on a CUDA device (unless
  Triton's interpreter is on) fall back to the cpu rule.
Tiles are chosen by the number of rows M (TILE_TABLE) without changing the order in which 32-column chunks
are accumulated; K is cut into ranges (summed apart, then added in order) by the weight's shape alone
(`k_splits`), the same for every M. So a row's result does not depend on the batch as long as the
tensor-core dot of one chunk gives the same bits whatever the tile (checked on the GPU by
tests/cuda/test_linear.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from dsgraph.platform import env
from dsgraph.platform.cpu import rules_core, rules_quant
from dsgraph.platform.cpu.dtypes import to_torch

__all__ = [
    "CANDIDATES",
    "HOPPER_TILES",
    "RULES",
    "TILE_TABLE",
    "Tiles",
    "dot_kind",
    "grouped_linear",
    "k_splits",
    "linear",
    "tiles_for",
]


class Tiles(NamedTuple):
    """One launch configuration of linear_tl.linear_kernel. block_k is a multiple of 32 (the scale block):
    a pipeline step loads block_k / 32 chunks, which are still accumulated one at a time in K order.
    prequant: FP8 activations are quantized by a separate pass once per row, not once per N tile."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    prequant: bool = False


# The tiles verified on the H200 before the M classes (5d68e1c): the large-M entry. With block_k 128
# (four chunks per step) ptxas for sm_90a spills at 4 and 8 warps at this block_n.
HOPPER_TILES = Tiles(64, 128, 32, 8, 4)

# (largest M, tiles), M increasing; the last entry serves every larger M. M is the number of rows (tokens).
# Decode streams the weights once: small block_n gives N / block_n programs enough to fill 132 SMs, and
# several chunks per step keep more weight bytes in flight. block_m stays 64 in every class so every class
# uses the same (wgmma) tensor-core instruction shape per output element; tools/bench/linear_sweep.py
# times the candidates and tests/cuda/test_linear.py checks bit equality across classes on the GPU.
# Picked from the H200 sweep at 5d68e1c (bench/results/linear-sweep-H200-5d68e1c.json): per layer at M=1
# 1.08 -> 0.44 ms, at M=4096 15.4 -> 3.6 ms, every pick bit-equal to HOPPER_TILES. block_m 16 candidates
# were faster at M <= 8 but not bit-equal (another tensor-core path), so they are out.
TILE_TABLE: tuple[tuple[int, Tiles], ...] = (
    (16, Tiles(64, 32, 128, 4, 4, True)),
    (64, Tiles(64, 64, 128, 4, 4, True)),
    (1 << 62, Tiles(128, 128, 32, 8, 4)),
)

# Candidates per M class (same keys as TILE_TABLE's bounds), timed by tools/bench/linear_sweep.py,
# compiled for sm_90 by tests/cuda/hopper_compile.py and run under the interpreter by test_linear.py.
CANDIDATES: dict[int, tuple[Tiles, ...]] = {
    16: (
        Tiles(64, 16, 128, 4, 4, True),
        Tiles(64, 32, 128, 4, 4, True),
        Tiles(64, 32, 128, 4, 4),
        Tiles(64, 32, 256, 4, 4, True),
        Tiles(64, 32, 64, 4, 8, True),
        Tiles(64, 64, 128, 4, 4, True),
    ),
    64: (
        Tiles(64, 32, 128, 4, 4, True),
        Tiles(64, 64, 128, 4, 4, True),
        Tiles(64, 64, 128, 4, 4),
        Tiles(64, 64, 64, 4, 6, True),
        Tiles(64, 128, 64, 8, 4, True),
    ),
    1 << 62: (
        HOPPER_TILES,
        Tiles(64, 128, 32, 8, 4, True),
        Tiles(64, 128, 64, 8, 4, True),
        Tiles(128, 128, 32, 8, 4),
        Tiles(128, 128, 32, 8, 4, True),
        Tiles(128, 64, 64, 8, 4, True),
    ),
}


# K splits: decode (M <= 16) has ceil(N / 32) programs per group, too few to fill 132 SMs for the narrow
# projections (72 for the shared experts' 2304 rows, 16 for the indexer's 512). K is cut into up to
# MAX_SPLITS ranges of a multiple of SPLIT_ALIGN columns until the decode grid has SPLIT_TARGET programs;
# the count depends on the weight's shape only, never on M, so a row's bits stay batch invariant (every
# M runs the same splits, added in the same order).
SPLIT_TARGET = 264  # decode programs wanted (two per SM)
SPLIT_ALIGN = 256  # columns: a multiple of every BLOCK_K in TILE_TABLE and CANDIDATES
MAX_SPLITS = 8
MIN_SPLIT = 512  # at least this many columns per split


def k_splits(groups: int, n_size: int, k_size: int) -> int:
    """How many K ranges a GEMM of this weight shape is cut into (1: none)."""
    programs = groups * -(-n_size // 32)
    valid = [1] + [
        s for s in range(2, MAX_SPLITS + 1) if k_size % (SPLIT_ALIGN * s) == 0 and k_size // s >= MIN_SPLIT
    ]
    return next((s for s in valid if programs * s >= SPLIT_TARGET), valid[-1])


def tiles_for(m: int) -> Tiles:
    """The tiles for a GEMM of m rows: the first TILE_TABLE entry whose bound is >= m. Every entry keeps
    each output element's K order (batch invariance holds if the tensor-core dots agree: GPU-tested)."""
    for bound, tiles in TILE_TABLE:
        if m <= bound:
            return tiles
    return TILE_TABLE[-1][1]


def _uses_kernel(p: Any, x: Tensor) -> bool:
    if p.weight_format == "dense" and p.act_quant != "none":
        return False
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
    return linear_tl.DOT_F32


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
    kind = dot_kind(p.act_quant, x3, w if p.weight_format == "dense" else None)
    splits = k_splits(x3.shape[1], n_size, x3.shape[2])
    linear_tl.launch(x3, w.contiguous(), scale_bytes, out, kind, tiles or tiles_for(x3.shape[0]), splits)
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


RULES: dict[str, Any] = {"linear": linear, "grouped_linear": grouped_linear}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them): the
# activation's FP8 quantization, the GEMM and the reduction of its K splits
KERNELS: dict[str, tuple[str, ...]] = {
    "linear": ("linear_tl.quantize_rows_kernel", "linear_tl.linear_kernel", "linear_tl.reduce_splits_kernel"),
    "grouped_linear": (
        "linear_tl.quantize_rows_kernel",
        "linear_tl.linear_kernel",
        "linear_tl.reduce_splits_kernel",
    ),
}
