"""cuda rules of `index_scores` (Triton, indexer_tl.py), `candidate_mask` and `topk_select` (torch on the
device, O(width) per row: no full sort), with the cpu rules' signatures, dtypes and shapes.

Selection by `k_largest`: torch.topk gives the k-th largest value v (exact; which of several equal
entries torch returns is unspecified, so its indices are not used); every entry above v is chosen, then
the lowest-indexed entries equal to v fill the remaining places, and -inf is never chosen. That is the
cpu rule's stable descending sort ("ties: lowest index"), without sorting. Each row is computed on its own.

`index_scores` checks seq_ids and block ids (one host sync; not under `step_rows.unchecked()` or while a
CUDA graph is captured).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_attention
from dsgraph.platform.cpu.rules_attention import candidate_block_scores
from dsgraph.platform.cpu.step_rows import real_rows
from dsgraph.platform.cuda.kernels.attention import dot_kind, runs_kernels, should_check

BLOCK_E = 64  # entries per program
NUM_WARPS = 4
ROW_BLOCK = 4096  # rows per piece of candidate_mask and topk_select (bounds their temporaries)
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
    tensors = (q, w.float(), keys, block_table, positions, seq_ids)
    sizes = (heads, keys.shape[0], keys.shape[1], block_table.shape[1], p.ratio)
    K.index_scores_kernel[grid](
        *(t.contiguous() for t in tensors), out, *sizes, HEAD_DIM=width, BLOCK_H=max(16, _next_pow2(heads)),
        BLOCK_D=_next_pow2(width), BLOCK_E=BLOCK_E, DOT=dot_kind(q.dtype), num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


def k_largest(scores: Tensor, k: int) -> Tensor:
    """bool [rows, E]: the (at most) k entries > -inf with the largest scores, ties to the lowest index."""
    rows, width = scores.shape
    if width == 0 or k == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    kth = scores.topk(min(k, width), dim=1).values[:, -1:]  # [rows, 1]
    above = scores > kth
    tied = scores == kth
    room = k - above.sum(dim=1, keepdim=True)
    return (above | (tied & (tied.cumsum(dim=1) <= room))) & (scores > NEG_INF)


def _by_row_blocks(rule: Any) -> Any:
    """`rule(p, scores)` applied to blocks of ROW_BLOCK rows (each row is computed on its own, so the
    result is the same): its temporaries ([rows, E] int64 cumsums, masks) stay a few GB at a 64k-token
    chunk instead of tens."""

    def blocked(p: Any, scores: Tensor) -> Tensor:
        if scores.shape[0] <= ROW_BLOCK:
            return rule(p, scores)
        return torch.cat([rule(p, part) for part in scores.split(ROW_BLOCK)])

    blocked.__doc__, blocked.__name__ = rule.__doc__, rule.__name__
    return blocked


def _topk_select(p: Any, scores: Tensor) -> Tensor:
    rows, width = scores.shape
    chosen = k_largest(scores, p.k)
    # Chosen entries in ascending order: entry g goes to place (number chosen before it); the others are
    # sent to a spare column p.k that is dropped.
    place = torch.where(chosen, chosen.cumsum(dim=1) - 1, p.k)
    entry = torch.arange(width, device=scores.device, dtype=torch.int32).expand(rows, -1)
    out = torch.full((rows, p.k + 1), -1, dtype=torch.int32, device=scores.device)
    return out.scatter_(1, place, entry)[:, : p.k]


def _candidate_mask(p: Any, scores: Tensor) -> Tensor:
    """The cpu rule's block scores; the top blocks by `k_largest` instead of a sort."""
    block_scores, visible = candidate_block_scores(p, scores)
    keep = k_largest(block_scores, p.topk_blocks)
    return keep.repeat_interleave(p.block_size, dim=1)[:, : scores.shape[1]] & visible


topk_select = _by_row_blocks(_topk_select)
candidate_mask = _by_row_blocks(_candidate_mask)

RULES: dict[str, Any] = {
    "index_scores": index_scores,
    "candidate_mask": candidate_mask,
    "topk_select": topk_select,
}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them); the
# selections are torch operations on the device
KERNELS: dict[str, tuple[str, ...]] = {
    "index_scores": ("indexer_tl.index_scores_kernel",),
    "candidate_mask": (),
    "topk_select": (),
}
