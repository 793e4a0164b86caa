"""cuda rules of `index_scores` (Triton, indexer_tl.py), `candidate_mask` and `topk_select` (Triton,
select_tl.py: a radix select per row, no sort), with the cpu rules' signatures, dtypes and shapes.

The selections are exact: the entries the cpu rule's stable descending sort puts first ("ties: lowest
index"; NaN ranked above every number and -inf never output, as there). Each row is computed on its own.

`index_scores` checks seq_ids and block ids (one host sync; not under `step_rows.unchecked()` or while a
CUDA graph is captured).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_attention
from dsgraph.platform.cpu.step_rows import real_rows
from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels.attention import dot_kind, runs_kernels, should_check

BLOCK_E = 64  # entries per program
NUM_WARPS = 4
ROW_BLOCK = 4096  # rows per piece of candidate_mask (bounds its block scores)
NEG_INF = float("-inf")


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _check_blocks(block_table: Tensor, num_blocks: int, seq: Tensor, real: Tensor) -> None:
    if block_table.shape[0] == 0:
        return
    blocks = block_table.long()[seq]
    bad = real.unsqueeze(1) & (blocks >= num_blocks)
    if bool(bad.any()):
        t, column = (int(i) for i in bad.nonzero()[0])
        raise IndexError(
            f"index_scores: row {t} (sequence {int(seq[t])}) has block_table[{int(seq[t])}, {column}] = "
            f"{int(blocks[t, column])}, past the pool of {num_blocks} blocks"
        )


def index_scores(
    p: Any, q: Tensor, w: Tensor, keys: Tensor, block_table: Tensor, positions: Tensor, seq_ids: Tensor
) -> Tensor:
    if not runs_kernels(q) or p.key_fmt != "mxfp4_g32":  # the kernel decodes MXFP4 keys only
        return rules_attention.index_scores(p, q, w, keys, block_table, positions, seq_ids)
    from dsgraph.platform.cuda.kernels import indexer_tl as K

    rows, heads, width = q.shape
    if should_check(q):
        real, seq = real_rows("index_scores", seq_ids, block_table.shape[0])
        _check_blocks(block_table, keys.shape[0], seq, real)
    num_entries = block_table.shape[1] * keys.shape[1]
    out = torch.empty(rows, num_entries, dtype=torch.float32, device=q.device)
    if rows == 0 or num_entries == 0:
        return out
    if block_table.shape[0] == 0:  # no sequence: every row is padding
        return out.fill_(NEG_INF)
    grid = (rows, -(-num_entries // BLOCK_E))
    tensors = (q, w, keys, block_table, positions, seq_ids)  # the kernel reads w as f32
    sizes = (heads, keys.shape[0], keys.shape[1], block_table.shape[1], p.ratio)
    K.index_scores_kernel[grid](
        *(t.contiguous() for t in tensors), out, *sizes, HEAD_DIM=width, BLOCK_H=max(16, _next_pow2(heads)),
        BLOCK_D=_next_pow2(width), BLOCK_E=BLOCK_E, DOT=dot_kind(q.dtype), num_warps=NUM_WARPS,
        **pdl.launch(),
    )  # fmt: skip
    return out


SELECT_BLOCK = 4096  # the most entries (or blocks) per tile of the selection kernels
SELECT_MIN_BLOCK = 1024


def _select_tiles(width: int, block_size: int = 1) -> tuple[int, int, int]:
    """(BLOCK, BLOCK_S, num_warps): a row of `width` entries in tiles of [BLOCK // BLOCK_S blocks,
    BLOCK_S entries]. A program walks its row five times (four histogram passes, then the output), so
    wide tiles with 8 warps cut the serial steps of a decode row (one program per row)."""
    block_s = _next_pow2(block_size)
    block = max(min(SELECT_BLOCK, _next_pow2(width)), SELECT_MIN_BLOCK, block_s)
    return block, block_s, 8 if block > SELECT_MIN_BLOCK else 4


def topk_select(p: Any, scores: Tensor) -> Tensor:
    """The k largest entries of each row (ties: lowest index; -inf never), ascending, -1 after: one
    launch (select_tl.topk_select_kernel)."""
    from dsgraph.platform.cuda.kernels import select_tl as K

    rows, width = scores.shape
    if rows == 0 or width == 0 or p.k == 0:
        return torch.full((rows, p.k), -1, dtype=torch.int32, device=scores.device)
    out = torch.empty(rows, p.k, dtype=torch.int32, device=scores.device)  # every place is written
    block, _, warps = _select_tiles(width)
    K.topk_select_kernel[(rows,)](
        scores.float().contiguous(), out, width, p.k, BLOCK=block, num_warps=warps, **pdl.launch()
    )
    return out


def _candidate_mask(p: Any, scores: Tensor) -> Tensor:
    """The cpu rule's block scores (the newest visible entry's block forced to +inf), then the entries of
    the top `topk_blocks` blocks that are visible: two launches (select_tl)."""
    from dsgraph.platform.cuda.kernels import select_tl as K

    rows, width = scores.shape
    if rows == 0 or width == 0 or p.topk_blocks == 0:
        return torch.zeros(rows, width, dtype=torch.bool, device=scores.device)
    out = torch.empty(rows, width, dtype=torch.bool, device=scores.device)  # every entry is written
    scores = scores.float().contiguous()
    num_blocks = -(-width // p.block_size)
    blocks = torch.empty(rows, num_blocks, dtype=torch.float32, device=scores.device)
    block, block_s, warps = _select_tiles(width, p.block_size)
    sizes = (width, num_blocks, p.block_size)
    tiles = dict(BLOCK=block, BLOCK_S=block_s, num_warps=warps)
    K.block_scores_kernel[(rows,)](scores, blocks, *sizes, **tiles, **pdl.launch())
    K.block_mask_kernel[(rows,)](
        blocks, scores, out.view(torch.uint8), *sizes, p.topk_blocks, **tiles, **pdl.launch()
    )
    return out


def _by_row_blocks(rule: Any) -> Any:
    """`rule(p, scores)` applied to blocks of ROW_BLOCK rows (each row is computed on its own, so the
    result is the same): its block scores ([rows, E / block_size] f32) stay bounded at a 64k-token chunk."""

    def blocked(p: Any, scores: Tensor) -> Tensor:
        if scores.shape[0] <= ROW_BLOCK:
            return rule(p, scores)
        return torch.cat([rule(p, part) for part in scores.split(ROW_BLOCK)])

    blocked.__doc__, blocked.__name__ = rule.__doc__, rule.__name__
    return blocked


candidate_mask = _by_row_blocks(_candidate_mask)

RULES: dict[str, Any] = {
    "index_scores": index_scores,
    "candidate_mask": candidate_mask,
    "topk_select": topk_select,
}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them)
KERNELS: dict[str, tuple[str, ...]] = {
    "index_scores": ("indexer_tl.index_scores_kernel",),
    "candidate_mask": ("select_tl.block_scores_kernel", "select_tl.block_mask_kernel"),
    "topk_select": ("select_tl.topk_select_kernel",),
}
