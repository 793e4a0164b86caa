"""CUDA rules of `moe_route`, `moe_experts`, `swiglu` and the one-rank `moe_dispatch` (ops/moe.py; cpu
meaning: platform/cpu/rules_moe.py).

- moe_route: the gate GEMM through the batch-invariant linear kernel (FP32 out), then sqrt(softplus) in
  f64 rounded once (torch ops on the device, element-wise), then one launch (moe_route_tl.py) for the
  top-k of s + bias in the stable descending order (equal scores: lowest id first) and the
  renormalisation, one program per row: batch invariant.
- moe_experts: four launches (moe_tl.py). The plan kernel sorts the (row, slot) pairs by expert id
  (stable, so by row within an expert) and writes the tile table (expert, first row, end row) for a grid
  bound known from the shapes; the w1/w3 grouped GEMM with the gemm_out rounding, clamped SwiGLU and
  routing weight fused writes the activation; the w2 grouped GEMM writes each pair's output; the combine
  kernel adds a row's expert outputs in increasing expert id, in FP32, the cpu rule's order, and rounds
  once to out_dtype. No host synchronisation except the id range check, which is skipped while a CUDA
  graph is being captured or checks are off (the kernels then treat an id >= E as padding).
  MXFP4 weights with an FP8-g32 or BF16 activation (the serving cases) run the swap-AB kernels of
  moe_swap_tl.py instead (weight rows on the dot's M side, BF16 dots of exact products over BLOCK_K
  columns), with tiles chosen by the step's row bucket (SWAP_BUCKETS; BLOCK_T 16 at decode); an extra
  launch qdq's x once, and the plan runs again when the down GEMM's BLOCK_T differs from the gated
  one's. The decode tiles upcast the packed weights with inline PTX (SwapTiles.asm: the same BF16 values
  as tl.dot_scaled's upcast, fewer instructions; one multiply per code pair fewer where every scale byte
  is at most 128, known on the host per tensor: ../scale_bound.py), and so do the prefill tiles.
- swiglu: one element-wise kernel; swiglu_qdq (ops/fused.py) the same kernel quantizing its result.
Dense expert weights with act_quant fp8_g32 (no V4.1 graph uses it), and tensors off a CUDA device
(unless Triton's interpreter is on), fall back to the cpu rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dsgraph.ops.fused import inner_params
from dsgraph.platform import env
from dsgraph.platform.cpu import rules_moe
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.step_rows import checking
from dsgraph.platform.cuda.kernels import linear as cuda_linear
from dsgraph.platform.cuda.kernels.elementwise import binary_operands
from dsgraph.platform.cuda.kernels.mhc import triton_dtype
from dsgraph.platform.cuda.kernels.quant_act import epilogue, no_epilogue, then_qdq
from dsgraph.platform.cuda.scale_bound import scales_at_most_128

__all__ = [
    "DOWN_TILES",
    "GATED_TILES",
    "RULES",
    "SWAP_BUCKETS",
    "SwapBuckets",
    "SwapTiles",
    "moe_dispatch",
    "moe_experts",
    "moe_route",
    "swiglu",
    "swiglu_qdq",
]

# BLOCK_M, BLOCK_N, num_warps, num_stages of the expert GEMMs; fixed, never chosen from the row count.
# Both share BLOCK_M (one tile table). The fused w1/w3 GEMM holds two accumulators: BLOCK_N 64 keeps it
# free of register spills at 8 warps (218 registers for sm_90a), as BLOCK_N 128 does for w2 (216).
GATED_TILES = (64, 64, 8, 3)
DOWN_TILES = (64, 128, 8, 3)


@dataclass(frozen=True)
class SwapTiles:
    """Tiles of one swap-AB expert GEMM (moe_swap_tl.py): weight rows, sorted rows and columns per dot."""

    block_w: int
    block_t: int
    block_k: int
    num_warps: int
    num_stages: int
    scaled: bool = False  # tl.dot_scaled upcasts the packed weights (moe_swap_tl.py); else _dequantize
    asm: bool = False  # the inline-PTX E2M1 upcast (moe_swap_tl._dequantize_asm) instead
    # the sorted rows on the dot's M side and the dequantized weights as its shared-memory operand
    # (moe_swap_tl._token_dots), with the kernel's own dequantization
    tokens: bool = False

    def __post_init__(self) -> None:
        if self.scaled + self.asm + self.tokens > 1:
            raise ValueError(f"moe swap tiles {self}: scaled, asm and tokens: expected at most one set")
        # on one warp (32 weight rows) the PTX's bits differed from the dequantization's on the H200
        # (tests/cuda/test_moe.py), cause not found; the layouts of 2 to 8 warps matched
        if self.asm and self.num_warps < 2:
            raise ValueError(f"moe swap tiles {self}: asm needs num_warps >= 2")


# (most step rows, gated tiles, down tiles) buckets in increasing row order, the last one taking every
# larger step. Buckets may differ in BLOCK_T, BLOCK_W, warps, stages and `scaled` (the same bits: the
# bucket-switch test of tests/cuda/test_moe.py checks it) but must share BLOCK_K (the dots' K order), so
# a row's result never depends on the bucket (batch invariance).
SwapBuckets = tuple[tuple[int, SwapTiles, SwapTiles], ...]
_BIG = 1 << 62
# Decode streams each touched expert's weights once: 16 sorted rows per tile, two warps per 64 weight
# rows, the inline-PTX upcast (fewer instructions per code than dot_scaled's, the same bits). Prefill is
# compute bound: 64 or 128 sorted rows per tile on one warpgroup of 64 weight rows, the same upcast (the
# prefill_asm sweep, bench/results/moe-sweep-*-prefill-asm-*.json: 1.16x the kernel's own dequantization
# at 128 x 64 tiles on 4,096 rows, 1.18x on 16,384, the same bits).
SWAP_BUCKETS: SwapBuckets = (
    (512, SwapTiles(64, 16, 64, 2, 3, asm=True), SwapTiles(64, 16, 64, 2, 3, asm=True)),
    (_BIG, SwapTiles(64, 64, 64, 4, 3, asm=True), SwapTiles(64, 128, 64, 4, 3, asm=True)),
)


def check_buckets(buckets: SwapBuckets) -> None:
    """ValueError unless every tile set of `buckets` has the same BLOCK_K (see SWAP_BUCKETS)."""
    ks = {t.block_k for _, *tiles in buckets for t in tiles}
    if len(ks) > 1:
        raise ValueError(f"moe swap buckets: BLOCK_K {sorted(ks)} differ between buckets, expected one")


check_buckets(SWAP_BUCKETS)


def _on_device(x: Tensor) -> bool:
    return x.is_cuda or env.triton_interpreting()


def moe_route(p: Any, u: Tensor, gate_w: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    if not _on_device(u):
        return rules_moe.moe_route(p, u, gate_w, bias)
    gemm = SimpleNamespace(weight_format="dense", act_quant="none", out_dtype="f32")
    # The cpu rule multiplies u.float() by gate_w.float(): a mixed pair must not round u to gate_w's dtype.
    x = u if u.dtype == gate_w.dtype else u.float()
    w = gate_w if u.dtype == gate_w.dtype else gate_w.float()
    logits = cuda_linear.linear(gemm, x, w)
    rows, num_experts = logits.shape
    if p.topk > num_experts or rows == 0:  # the sort's shapes (every expert, or nothing): torch's
        return rules_moe.route_select(p, torch.sqrt(F.softplus(logits.double()).float()), bias)
    from dsgraph.platform.cuda.kernels import moe_route_tl

    weights = torch.empty((rows, p.topk), dtype=torch.float32, device=logits.device)
    ids = torch.empty((rows, p.topk), dtype=torch.int32, device=logits.device)
    # one bias for every row ([E] or [1, E]: read with row stride 0, no copy per row), or a row's each
    one_row = bias.shape[-1] == num_experts and bias.numel() == num_experts
    bias = bias.float().reshape(num_experts) if one_row else torch.broadcast_to(bias.float(), logits.shape)
    eps = rules_moe._RENORM_EPS
    moe_route_tl.launch_route_select(logits.contiguous(), bias, p.topk, p.routed_scaling, eps, weights, ids)
    return weights, ids


def swiglu(p: Any, g: Tensor, v: Tensor) -> Tensor:
    if not _on_device(g):
        return rules_moe.swiglu(p, g, v)
    from dsgraph.platform.cuda.kernels import moe_tl

    g, v, out = binary_operands(g, v, p.out_dtype)
    if out.numel():
        moe_tl.launch_swiglu(g, v, out, out, float(p.limit), triton_dtype(out.dtype), True, no_epilogue(out))
    return out


def swiglu_qdq(p: Any, g: Tensor, v: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    """swiglu and the act_qdq of its result in one launch (ops/fused.py)."""
    y_dtype = to_torch(p.out_dtype)
    applies = _on_device(g) and g.shape == v.shape and g.dim()
    fused = epilogue(p, tuple(g.shape), y_dtype, g.device, g.shape[-1]) if applies else None
    if fused is None:
        return then_qdq(p, swiglu(inner_params(p), g, v))
    from dsgraph.platform.cuda.kernels import moe_tl

    q, qdq = fused
    out = torch.empty(g.shape, dtype=y_dtype, device=g.device) if p.raw else q
    g, v = g.contiguous(), v.contiguous()
    moe_tl.launch_swiglu(g, v, out, q, float(p.limit), triton_dtype(y_dtype), p.raw, qdq)
    return (out, q) if p.raw else q


# (rows, device) -> the zeros a one-rank moe_dispatch returns as src
_ZERO_SOURCES: dict[tuple[int, torch.device], Tensor] = {}


def moe_dispatch(p: Any, x: Tensor, ids: Tensor, weights: Tensor) -> tuple[Tensor, ...]:
    """One rank: the cpu rule's identity. Its src (all zeros, which nothing writes) is one tensor kept per
    row count and device, made on the first (eager) run: a captured step launches no fill for it."""
    key = (x.shape[0], x.device)
    src = _ZERO_SOURCES.get(key)
    if src is None:
        src = _ZERO_SOURCES.setdefault(key, rules_moe.moe_dispatch(p, x, ids, weights)[3])
    return x, ids, weights, src


def _check_ids(ids: Tensor, num_experts: int) -> None:
    """The cpu rule's id range check; it reads back to the host, so it is skipped during graph capture and
    under `step_rows.unchecked()` (then no launch either)."""
    if not checking() or (ids.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    rules_moe._check_ids(ids, num_experts)


def _plan(ids: Tensor, weights: Tensor, num_experts: int, block_m: int) -> dict[str, Tensor]:
    """The pairs (row, slot) sorted by expert (stable; padding last) and the tile table, by one kernel.

    A tile is BLOCK_M sorted rows of one expert; expert e with c rows has ceil(c / BLOCK_M) tiles, so the
    step has at most ceil(P / BLOCK_M) + min(E, P) tiles for P = rows * slots: that bound is the grid,
    and the tiles past the last real one carry expert E (the kernel skips them).
    """
    from dsgraph.platform.cuda.kernels import moe_tl

    pairs = ids.numel()
    num_tiles = -(-pairs // block_m) + min(num_experts, pairs)
    i32 = dict(dtype=torch.int32, device=ids.device)
    plan = {name: torch.empty(pairs, **i32) for name in ("token", "position")}
    plan["route"] = torch.empty(pairs, dtype=torch.float32, device=ids.device)
    plan |= {name: torch.empty(num_tiles, **i32) for name in ("tile_expert", "tile_start", "tile_end")}
    moe_tl.launch_plan(ids, weights, num_experts, block_m, plan)
    return plan


def _expert_config(p: Any, a: Tensor, w: Tensor, tiles: tuple[int, int, int, int]) -> dict[str, Any]:
    """Kernel constants of one expert GEMM with activations a and weights w."""
    from dsgraph.platform.cuda.kernels import moe_tl

    block_m, block_n, num_warps, num_stages = tiles
    dense = w if p.weight_format == "dense" else None
    return dict(
        DOT_KIND=cuda_linear.dot_kind(p.act_quant, a, dense),
        GEMM_DTYPE=moe_tl.GEMM_DTYPES[p.gemm_out_dtype],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def moe_experts(
    p: Any, x: Tensor, ids: Tensor, weights: Tensor, *ws: Tensor, swap: SwapBuckets | None = SWAP_BUCKETS
) -> Tensor:
    """`swap`: the swap-AB kernels' tiles per row bucket (SWAP_BUCKETS unless given: sweeps, tests); None
    runs the base kernels in every case (the reference the sweeps check the swap kernels against)."""
    if not _on_device(x) or (p.weight_format == "dense" and p.act_quant != "none"):
        return rules_moe.moe_experts(p, x, ids, weights, *ws)
    from dsgraph.platform.cuda.kernels import moe_tl

    num_experts, inter = ws[0].shape[0], ws[0].shape[1]
    _check_ids(ids, num_experts)
    rows, hidden = x.shape
    if rows == 0 or ids.shape[1] == 0:
        return torch.zeros(x.shape, dtype=to_torch(p.out_dtype), device=x.device)
    x = x.contiguous()
    fp4 = p.weight_format == "mxfp4_rows"
    w1, w3, w2 = (w.contiguous() for w in ws[:3])
    s1, s3, s2 = (s.contiguous().view(torch.uint8) for s in ws[3:]) if fp4 else (None, None, None)
    ids = ids.to(torch.int32).contiguous()
    if swap is not None and _swap_covers(p, x):
        # the bound is kept per tensor object: read it on the caller's scale tensors, not on the views
        one = any(t.asm for _, *tiles in swap for t in tiles) and scales_at_most_128(*ws[3:6])
        return _swap_experts(p, x, ids, weights.contiguous(), (w1, s1, w3, s3, w2, s2), swap, one)
    plan = _plan(ids, weights.contiguous(), num_experts, GATED_TILES[0])
    tiles = (plan["tile_expert"], plan["tile_start"], plan["tile_end"])
    config = _expert_config(p, x, w1, GATED_TILES)
    # The w2 GEMM reads the activation as the cpu rule does: FP8-qdq'd from FP32, or rounded to x's dtype.
    act_dtype = torch.float32 if p.act_quant == "fp8_g32" else x.dtype
    act = torch.empty((ids.numel(), inter), dtype=act_dtype, device=x.device)
    limit = float(p.swiglu_limit)
    moe_tl.launch_expert_gemm(x, plan["token"], (w1, s1, w3, s3), plan["route"], tiles, act, limit, config)
    y = torch.empty((ids.numel(), hidden), dtype=to_torch(p.gemm_out_dtype), device=x.device)
    config2 = _expert_config(p, act, w2, DOWN_TILES)
    moe_tl.launch_expert_gemm(act, None, (w2, s2, None, None), None, tiles, y, limit, config2)
    out = torch.empty(x.shape, dtype=to_torch(p.out_dtype), device=x.device)
    moe_tl.launch_combine(y, ids, plan["position"], num_experts, out)
    return out


def _swap_covers(p: Any, x: Tensor) -> bool:
    """The swap kernels dot BF16 values: MXFP4 weights against an FP8-g32 activation (any x dtype) or a
    BF16 one; other cases run the base kernels."""
    return p.weight_format == "mxfp4_rows" and (p.act_quant == "fp8_g32" or x.dtype == torch.bfloat16)


def _swap_config(p: Any, x: Tensor, tiles: SwapTiles, one: bool) -> dict[str, Any]:
    """one: every scale byte of the weights is at most 128 (../scale_bound.py): the asm upcast's one-multiply
    form."""
    from dsgraph.platform.cuda.kernels import moe_tl

    return dict(
        GEMM_DTYPE=moe_tl.GEMM_DTYPES[p.gemm_out_dtype],
        WIDE=not x.is_cuda,  # the interpreter's BF16 dot is wrong: FP32 dots of the same values
        BLOCK_W=tiles.block_w,
        BLOCK_T=tiles.block_t,
        BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        SCALED=tiles.scaled and x.is_cuda,
        ASM=tiles.asm and x.is_cuda,
        ONE=tiles.asm and x.is_cuda and one,
        TOKENS=tiles.tokens,
    )


def _swap_experts(
    p: Any, x: Tensor, ids: Tensor, weights: Tensor, ws: tuple[Tensor, ...], buckets: SwapBuckets, one: bool
) -> Tensor:
    """moe_experts through the swap-AB kernels (moe_swap_tl.py); the tiles follow the row bucket."""
    from dsgraph.platform.cuda.kernels import moe_swap_tl, moe_tl

    w1, s1, w3, s3, w2, s2 = ws
    rows, hidden = x.shape
    gated, down = next((g, d) for most, g, d in buckets if rows <= most)
    num_experts, inter = w1.shape[0], w1.shape[1]
    a = x
    if p.act_quant == "fp8_g32":
        a = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
        moe_swap_tl.launch_qdq_rows(x, a)
    plan = _plan(ids, weights, num_experts, gated.block_t)
    tiles = (plan["tile_expert"], plan["tile_start"], plan["tile_end"])
    act = torch.empty((ids.numel(), inter), dtype=torch.bfloat16, device=x.device)
    config = _swap_config(p, x, gated, one) | dict(QDQ_OUT=p.act_quant == "fp8_g32")
    limit = float(p.swiglu_limit)
    moe_swap_tl.launch_swap_gemm(a, plan["token"], (w1, s1, w3, s3), plan["route"], tiles, act, limit, config)
    y = torch.empty((ids.numel(), hidden), dtype=to_torch(p.gemm_out_dtype), device=x.device)
    if down.block_t != gated.block_t:
        plan = _plan(ids, weights, num_experts, down.block_t)
        tiles = (plan["tile_expert"], plan["tile_start"], plan["tile_end"])
    config = _swap_config(p, x, down, one) | dict(QDQ_OUT=False)
    moe_swap_tl.launch_swap_gemm(act, None, (w2, s2, None, None), None, tiles, y, limit, config)
    out = torch.empty(x.shape, dtype=to_torch(p.out_dtype), device=x.device)
    moe_tl.launch_combine(y, ids, plan["position"], num_experts, out)
    return out


RULES: dict[str, Any] = {
    "moe_dispatch": moe_dispatch,
    "moe_route": moe_route,
    "moe_experts": moe_experts,
    "swiglu": swiglu,
    "swiglu_qdq": swiglu_qdq,
}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them): the gate
# GEMM through the linear kernel; the plan, the base or swap-AB expert GEMMs (with the swap path's
# activation qdq) and the combine
KERNELS: dict[str, tuple[str, ...]] = {
    "moe_dispatch": (),
    "moe_route": (  # the dense gate, then the selection
        "linear_tl.linear_kernel",
        "moe_route_tl.route_select_kernel",
    ),
    "moe_experts": (
        "moe_tl.plan_kernel",
        "moe_tl.expert_gemm_kernel",
        "moe_swap_tl.qdq_rows_kernel",
        "moe_swap_tl.swap_gemm_kernel",
        "moe_tl.combine_kernel",
    ),
    "swiglu": ("moe_tl.swiglu_kernel",),
    "swiglu_qdq": ("moe_tl.swiglu_kernel", "quant_act_tl.qdq_kernel"),
}
