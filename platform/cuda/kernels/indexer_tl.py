"""Triton kernel of `index_scores` (dsgraph.ops.attention): score(t, g) = sum_h w[t, h] relu(q[t, h] . k_g)
over MXFP4-g32 index keys read through the block table, -inf where the entry is not visible.

One program scores BLOCK_E consecutive entries of one row: the row's heads form the M side of one dot
against the decoded keys (E2M1 code times the UE8M0 power of two, exact in bf16), then relu, the head
weights and a sum over heads. Every score is computed on its own, so results do not depend on batching.
Importing this module imports triton; indexer.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.attention_tl import e2m1_to_f32, low_dot
from dsgraph.platform.cuda.kernels.quant_tl import e8m0_to_f32


@triton.jit
def mxfp4_g32_keys(base, row_off, d, mask, HEAD_DIM: tl.constexpr) -> tl.tensor:
    """Decode mxfp4_g32 entries at byte offsets row_off [N] (int64) -> f32 [N, BLOCK_D]."""
    packed = tl.load(base + row_off[:, None] + d[None, :] // 2, mask=mask, other=0).to(tl.int32)
    code = (packed >> ((d[None, :] % 2) * 4)) & 0xF
    scale = tl.load(base + row_off[:, None] + HEAD_DIM // 2 + d[None, :] // 32, mask=mask, other=127)
    return e2m1_to_f32(code) * e8m0_to_f32(scale)


@triton.jit
def index_scores_kernel(
    q_ptr,
    w_ptr,
    keys_ptr,
    table_ptr,
    pos_ptr,
    seq_ptr,
    out_ptr,
    num_heads,
    num_blocks,
    block_size,
    table_width,
    ratio,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_E: tl.constexpr,
    DOT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid (rows, cdiv(nb * bs, BLOCK_E)): scores [T, nb * bs] f32 of entries eb*BLOCK_E .. of row t."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    num_entries = table_width * block_size
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    seq = tl.load(seq_ptr + t)
    p = tl.load(pos_ptr + t)
    # A block of entries all past the row's causal limit (most of a long table in an early chunk) is
    # -inf without reading keys: the same values as computing it, at a store's cost.
    if (seq >= 0) & (tl.program_id(1) * BLOCK_E < (p + 1) // ratio):
        out = _scores(q_ptr, w_ptr, keys_ptr, table_ptr, t, e, seq, p, num_heads, num_blocks,
                      block_size, table_width, ratio, HEAD_DIM, BLOCK_H, BLOCK_D, DOT)  # fmt: skip
    else:
        out = tl.full([BLOCK_E], float("-inf"), tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * num_entries + e, out, mask=e < num_entries)


@triton.jit
def _scores(
    q_ptr, w_ptr, keys_ptr, table_ptr, t, e, seq, p, num_heads, num_blocks, block_size, table_width, ratio,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr,
) -> tl.tensor:  # fmt: skip
    """Scores [BLOCK_E] of entries e of row t (sequence seq >= 0, position p), -inf where not visible."""
    num_entries = table_width * block_size
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hmask = h < num_heads
    dmask = d < HEAD_DIM
    inside = e < num_entries
    block = tl.load(table_ptr + seq.to(tl.int64) * table_width + e // block_size, mask=inside, other=-1)
    # Blocks past the pool are refused by the rule's eager check; here they only read nothing.
    allocated = inside & (block >= 0) & (block < num_blocks)
    row = tl.where(allocated, block, 0).to(tl.int64) * block_size + e % block_size
    keys = mxfp4_g32_keys(
        keys_ptr, row * (HEAD_DIM // 2 + HEAD_DIM // 32), d, allocated[:, None] & dmask[None, :], HEAD_DIM
    )
    q_off = (t.to(tl.int64) * num_heads + h)[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_off, mask=hmask[:, None] & dmask[None, :], other=0.0)
    w = tl.load(w_ptr + t.to(tl.int64) * num_heads + h, mask=hmask, other=0.0).to(tl.float32)
    dots = low_dot(q, tl.trans(keys.to(q.dtype)), DOT)  # [BLOCK_H, BLOCK_E]
    scores = tl.sum(tl.maximum(dots, 0.0) * w[:, None], axis=0)
    visible = allocated & (e < (p + 1) // ratio)
    return tl.where(visible, scores, float("-inf"))
