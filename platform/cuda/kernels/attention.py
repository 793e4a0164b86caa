"""cuda rule of `attention` (dsgraph.ops.attention) over the Triton kernels of attention_tl.py.

Same signature, dtype and shape as platform/cpu/rules_attention.py `attention`. Two launch paths with
one arithmetic (see attention_tl.py): up to `decode_max_rows` rows the keys of a row are split over
programs (rows x head blocks x 2 column halves x splits, then a merge kernel), beyond it one program per
(row, head block, half) runs every split itself. Tile and split sizes are fixed (`TILES`; f32 queries
take smaller tiles: their operands need twice the shared memory), so a row's result never depends on the
batch. tools/bench/attn_sweep.py times other tilings against FlashMLA on the GPU (through `launch`'s
`tiling`); ptxas register and spill counts: tests/cuda/hopper_compile.py.

The tiles, for V4.1's 64 heads x 512, window 128 + top-k 512: a program decodes each key tile once for
its 32 heads and keeps one f32 accumulator [32, 256] (its half of the columns); the dots are mma.sync
with the query operand held by every warp. Beyond 32 rows, rows x 4 programs fill a Hopper GPU's 132
SMs without splitting, and splitting would only add the per-split state traffic (64 heads x 512 x 4 B
per split and row).

Operand checks: unless checks are off (`step_rows.unchecked()`) or a CUDA graph is being captured, the
rule raises the cpu rule's errors for bad seq_ids, ring slots, non-contiguous chunk rows and selected
entries outside allocated blocks, at the cost of one host sync each. Unchecked, the kernels treat such
keys as absent and keep every address inside its buffer: a bad step gives wrong values, not a fault.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dsgraph.platform import env
from dsgraph.platform.cpu import rules_attention, rules_dspark
from dsgraph.platform.cpu.step_rows import checking, locate_entries, per_row, real_rows, require_in_range
from dsgraph.platform.cuda import pdl


@dataclass(frozen=True)
class Tiles:
    """The tiles of the kernels. Every field is fixed per process (never chosen from the batch), so a
    row's bits do not depend on the batch; `decode_max_rows` only picks the launch path, and both paths
    give the same bits for given tiles. Other tiles may differ in the last bits (sum order)."""

    block_h: int = 32  # heads per program: each decoded key tile serves all of them (tl.dot needs M >= 16)
    block_n: int = 32  # keys per tile (f32 queries: at most F32_BLOCK_N, with 16 heads per program)
    split_tiles: int = 4  # tiles per split (SWA splits first, then pool splits)
    num_warps: int = 8
    num_stages: int | None = None  # Triton's software pipelining depth (None: its default)
    decode_max_rows: int = 32  # up to this many rows: split programs + merge; beyond: one per row
    key_ptx: bool = True  # bf16 queries: the pool's NVFP4 keys decoded by PTX (attention_tl.e2m1_bf16_pairs)


# 64 heads per program (wgmma, each key tile decoded once for all heads) faulted with an illegal memory
# access on the GPU in every form tried, so a program takes at most 32 heads.
TILES = Tiles()
F32_BLOCK_N = 16  # keys per tile for f32 queries (with 16 heads per program)
MERGE_H = 16  # heads per merge program (the merge is elementwise per head: any value gives the same bits)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def interpreting() -> bool:
    return env.triton_interpreting()


def runs_kernels(t: Tensor) -> bool:
    """Triton runs on CUDA tensors, and on CPU tensors only under its interpreter; the rules give CPU
    tensors to the cpu rule otherwise (the cuda platform then still runs on a machine without a GPU)."""
    return t.is_cuda or interpreting()


def dot_kind(dtype: torch.dtype) -> int:
    """attention_tl.low_dot's DOT: 0 IEEE f32, 1 native bf16/f16, 2 bf16/f16 values widened (interpreter)."""
    if dtype == torch.float32:
        return 0
    return 2 if interpreting() else 1


def attention_dot(dtype: torch.dtype, key_ptx: bool) -> int:
    """dot_kind, or 3 for bf16 on a GPU with `key_ptx`: native bf16 dots with the pool's keys decoded by
    PTX (attention_tl.e2m1_bf16_pairs: the same key values, so the same bits)."""
    kind = dot_kind(dtype)
    return 3 if kind == 1 and key_ptx and dtype == torch.bfloat16 else kind


def should_check(t: Tensor) -> bool:
    """Host-side value checks run unless `step_rows.unchecked()` is active or a CUDA graph is captured."""
    return checking() and not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _check_chunk_rows(
    positions: Tensor, seq: Tensor, real: Tensor, start: Tensor, first: Tensor, window: int
) -> None:
    """Every SWA key a row takes from this chunk (pos >= seq_start) sits at row t - (p - pos)."""
    rows = positions.shape[0]
    back = torch.arange(window - 1, -1, -1, device=positions.device)
    pos = positions.long().unsqueeze(1) - back
    need = real.unsqueeze(1) & (pos >= 0) & (pos >= first.unsqueeze(1)) & (pos >= start.unsqueeze(1))
    chunk_row = (torch.arange(rows, device=positions.device).unsqueeze(1) - back).clamp(0, max(rows - 1, 0))
    wrong = need & ((positions.long()[chunk_row] != pos) | (seq[chunk_row] != seq.unsqueeze(1)))
    if bool(wrong.any()):
        t, j = (int(i) for i in wrong.nonzero()[0])
        raise ValueError(
            f"attention: row {t} needs position {int(pos[t, j])} of its chunk (seq_start {int(start[t])}) "
            f"at row {t - window + 1 + j}, which holds another position or sequence; rows must be contiguous"
        )


def _check_operands(p: Any, ring: Tensor, operands: tuple[Tensor, ...]) -> None:
    """The cpu rule's operand errors (one host sync each); skipped while capturing."""
    positions, seq_ids, seq_slot, seq_start, seq_window_start = operands[:5]
    real, seq = real_rows("attention", seq_ids, seq_slot.shape[0])
    slot = per_row(seq_slot, seq, real)
    require_in_range("attention", slot, ring.shape[0], "ring slot of row", active=real)
    start, first = per_row(seq_start, seq, real), per_row(seq_window_start, seq, real)
    _check_chunk_rows(positions, seq, real, start, first, p.window)
    if len(operands) == 8:
        pool, block_table, topk = operands[5:]
        valid = real.unsqueeze(1) & (topk >= 0)
        row, column = valid.nonzero(as_tuple=True)
        entry = topk.long()[row, column]
        locate_entries("attention", block_table, seq[row], entry, row, pool.shape[1], pool.shape[0])


def attention(
    p: Any, q: Tensor, kv: Tensor, ring: Tensor, sink: Tensor, *operands: Tensor, tiling: Tiles = TILES
) -> Tensor:
    """`tiling`: TILES unless given (tests)."""
    # The kernel reads FP8-g32 rings and NVFP4-g16 pools; other cache formats run the cpu rule on device.
    if not runs_kernels(q) or (p.ring_fmt, p.pool_fmt) != ("fp8_g32", "nvfp4_g16"):
        return rules_attention.attention(p, q, kv, ring, sink, *operands)
    if should_check(q):
        _check_operands(p, ring, operands)
    return launch(p, q, kv, ring, sink, operands, split=q.shape[0] <= tiling.decode_max_rows, tiling=tiling)


def num_splits(window: int, topk_width: int, block_n: int, split_tiles: int) -> int:
    """ceil(SWA tiles / split_tiles) SWA splits, then ceil(pool tiles / split_tiles) pool splits."""
    swa, pool = -(-window // block_n), -(-topk_width // block_n)
    return -(-swa // split_tiles) + -(-pool // split_tiles)


def launch(
    p: Any, q: Tensor, kv: Tensor, ring: Tensor, sink: Tensor, operands: tuple[Tensor, ...], split: bool,
    tiling: Tiles = TILES, draft: int = 0,
) -> Tensor:  # fmt: skip
    """Run the decode path (`split`: per-split programs, then the merge) or the prefill path, unchecked,
    with `tiling` (TILES unless given: sweeps, tests); `draft` > 0: the kernels' draft-block mode
    (draft_attention below; p.window then counts the block's keys too)."""
    from dsgraph.platform.cuda.kernels import attention_tl as K

    rows, heads, width = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if rows == 0:
        return out
    seq_ids, seq_slot = operands[1], operands[2]
    has_pool = len(operands) == 8
    pool, block_table, topk = operands[5:] if has_pool else (ring, seq_slot.view(1, -1), seq_ids.view(-1, 1))
    topk_width = topk.shape[1] if has_pool else 0
    block_h, block_n = min(tiling.block_h, max(16, _next_pow2(heads))), tiling.block_n
    if q.dtype == torch.float32:  # f32 operands take twice the shared memory: 227 KB must hold the tiles
        block_h, block_n = 16, min(tiling.block_n, F32_BLOCK_N)
    block_c = max(16, _next_pow2(width // 2))
    splits = num_splits(p.window, topk_width, block_n, tiling.split_tiles)
    tensors = (q.contiguous(), kv.contiguous(), ring.contiguous(), pool.contiguous())
    sizes = (rows, heads, ring.shape[1], pool.shape[0], pool.shape[1], block_table.shape[1], topk_width)
    step = tuple(t.contiguous() for t in (*operands[:5], block_table, topk))
    meta = dict(
        NUM_SPLITS=splits, WINDOW=p.window, HEAD_DIM=width, BLOCK_H=block_h, BLOCK_C=block_c,
        BLOCK_N=block_n, SPLIT_TILES=tiling.split_tiles, HAS_POOL=has_pool,
        DOT=attention_dot(q.dtype, tiling.key_ptx), DRAFT=draft, num_warps=tiling.num_warps,
    )  # fmt: skip
    if tiling.num_stages is not None:
        meta["num_stages"] = tiling.num_stages
    grid, scale_log2 = (rows, 2 * -(-heads // block_h)), float(p.softmax_scale) * math.log2(math.e)
    if split:
        m = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
        lsum, acc = torch.empty_like(m), m.new_empty(rows, splits, heads, width)
        K.split_kernel[(*grid, splits)](
            *tensors, *step, m, lsum, acc, *sizes, scale_log2, **meta, **pdl.launch()
        )
        merge_h = min(MERGE_H, max(16, _next_pow2(heads)))
        K.merge_kernel[(rows, -(-heads // merge_h))](
            m, lsum, acc, sink.contiguous(), out, heads,
            NUM_SPLITS=splits, HEAD_DIM=width, BLOCK_H=merge_h, BLOCK_C=block_c, num_warps=4, **pdl.launch(),
        )  # fmt: skip
    else:
        K.fused_kernel[grid](
            *tensors, sink.contiguous(), *step, out, *sizes, scale_log2, **meta, **pdl.launch()
        )
    return out


def _check_draft(p: Any, ring: Tensor, operands: tuple[Tensor, ...]) -> bool:
    """The cpu rule's ring-slot error, then whether every real sequence has exactly block_size contiguous
    rows at positions seq_start[s] + 0, 1, .. (the runtime's draft layout, dspark_io.py), which the
    kernels' draft mode assumes (host syncs: checked steps only)."""
    positions, seq_ids, seq_slot, seq_start = operands[:4]
    real, seq = real_rows("draft_attention", seq_ids, seq_slot.shape[0])
    slot = per_row(seq_slot, seq, real)
    require_in_range("draft_attention", slot, ring.shape[0], "ring slot of row", active=real)
    offset = positions.long() - per_row(seq_start, seq, real).long()
    counts = torch.zeros(max(seq_slot.shape[0], 1), dtype=torch.long, device=seq_ids.device)
    counts = counts.scatter_add(0, seq, real.long())
    row = torch.arange(positions.shape[0], device=positions.device)
    first = (row - offset).clamp(0, max(positions.shape[0] - 1, 0))
    good = (offset >= 0) & (offset < p.block_size) & (counts[seq] == p.block_size) & (seq[first] == seq)
    return bool((good | ~real).all())


def draft_attention(
    p: Any, q: Tensor, kv: Tensor, ring: Tensor, sink: Tensor, *operands: Tensor, tiling: Tiles = TILES
) -> Tensor:
    """cuda rule of `draft_attention` (ops/dspark.py): the attention kernels in their draft mode, every row
    of a block taking the keys of the block's last row (context positions a - window .. a - 1, then the
    block's kv rows in row order), as the cpu rule orders them. The mode reads a row's place in its block
    from its position (a + offset); checked steps verify that layout and run the cpu rule on any other
    (unchecked, another layout gives wrong values, never reads outside the buffers). Values within the
    attention kernels' tolerance of the cpu rule (tests/cuda/test_attention.py)."""
    if not runs_kernels(q) or (should_check(q) and not _check_draft(p, ring, operands)):
        return rules_dspark.draft_attention(p, q, kv, ring, sink, *operands)
    widened = replace(p, window=p.window + p.block_size)  # the context and the block's own keys
    split = q.shape[0] <= tiling.decode_max_rows
    return launch(widened, q, kv, ring, sink, operands, split=split, tiling=tiling, draft=p.block_size)


RULES: dict[str, Any] = {"attention": attention, "draft_attention": draft_attention}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them): split
# programs and their merge up to decode_max_rows rows, else one fused program per row
KERNELS: dict[str, tuple[str, ...]] = {
    op: ("attention_tl.split_kernel", "attention_tl.merge_kernel", "attention_tl.fused_kernel")
    for op in ("attention", "draft_attention")
}
