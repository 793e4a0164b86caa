"""Triton kernels of the `sample` op's "greedy_token" rows (their rule: sampling.py). Importing this module
imports triton.

The token is torch's `argmax` over the masked logits, which the cpu rule takes: the first maximum, a NaN
counting as above every number (torch's max propagates NaN, so its argmax is the first NaN), and -1 on a
row with no logit above -inf. Two launches per call: the vocabulary splits into CHUNK-wide pieces, one
program each (a row of 129,280 logits is 32 programs, not one program streaming 505 KiB), then one
program per row merges its pieces in vocabulary order.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels import pdl_tl

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def argmax_split_kernel(
    logits_ptr, allowed_ptr, val_ptr, idx_ptr, nan_ptr, alive_ptr, vocab, words, splits,
    HAS_MASK: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False,
) -> None:  # fmt: skip
    """Grid (rows, splits): piece `split` of row `row`: its largest non-NaN logit, the first id holding it,
    its first NaN id (vocab if none) and whether any logit is above -inf; the allowed-token bitmask (bit
    t % 32 of word t // 32) masks the others to -inf first, as the cpu rule's masked_fill does."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    offs = split * CHUNK + tl.arange(0, CHUNK)
    inside = offs < vocab
    x = tl.load(logits_ptr + row * vocab + offs, mask=inside, other=NEG_INF)
    if HAS_MASK:
        word = tl.load(allowed_ptr + row * words + offs // 32, mask=inside, other=0)
        x = tl.where(((word >> (offs % 32)) & 1) != 0, x, NEG_INF)
    nan = x != x
    clean = tl.where(nan, NEG_INF, x)
    best = tl.max(clean, axis=0)
    at = row * splits + split
    tl.store(val_ptr + at, best)
    tl.store(idx_ptr + at, tl.min(tl.where(clean == best, offs, vocab), axis=0))
    tl.store(nan_ptr + at, tl.min(tl.where(nan, offs, vocab), axis=0))
    tl.store(alive_ptr + at, tl.max((x > NEG_INF).to(tl.int32), axis=0))


@triton.jit
def argmax_merge_kernel(
    val_ptr, idx_ptr, nan_ptr, alive_ptr, token_ptr, logprob_ptr, top_lp_ptr, top_ids_ptr,
    vocab, splits, k, SPLITS: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr = False,
) -> None:  # fmt: skip
    """Grid (rows,): the row's token from its pieces (the largest value, on ties the lowest id; any NaN
    wins, the first one; -1 when no piece has a logit above -inf) and the outputs "greedy_token" does not
    compute: logprob and top_logprobs NaN, top_ids -1."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SPLITS)
    inside = s < splits
    at = row * splits + s
    val = tl.load(val_ptr + at, mask=inside, other=NEG_INF)
    idx = tl.load(idx_ptr + at, mask=inside, other=vocab)
    first = tl.min(tl.where(val == tl.max(val, axis=0), idx, vocab), axis=0)
    first_nan = tl.min(tl.load(nan_ptr + at, mask=inside, other=vocab), axis=0)
    alive = tl.max(tl.load(alive_ptr + at, mask=inside, other=0), axis=0)
    token = tl.where(first_nan < vocab, first_nan, first)
    tl.store(token_ptr + row, tl.where(alive > 0, token, -1))
    nan = float("nan")
    tl.store(logprob_ptr + row, nan)
    j = tl.arange(0, K)
    tl.store(top_lp_ptr + row * k + j, tl.full([K], nan, tl.float32), mask=j < k)
    tl.store(top_ids_ptr + row * k + j, tl.full([K], -1, tl.int32), mask=j < k)


def launch_greedy_token(
    logits: Tensor, allowed: Tensor | None, parts: tuple[Tensor, ...], outs: tuple[Tensor, ...], chunk: int
) -> None:
    """`parts`: (val f32, idx i32, nan i32, alive i32), [rows * splits] each; `outs`: the four outputs."""
    rows, vocab = logits.shape
    splits = triton.cdiv(vocab, chunk)
    words = allowed.shape[1] if allowed is not None else 0
    mask = allowed if allowed is not None else logits  # never read without HAS_MASK
    argmax_split_kernel[(rows, splits)](
        logits,
        mask,
        *parts,
        vocab,
        words,
        splits,
        HAS_MASK=allowed is not None,
        CHUNK=chunk,
        num_warps=8,
        **pdl.launch(),
    )
    k = outs[2].shape[1]
    argmax_merge_kernel[(rows,)](
        *parts, *outs, vocab, splits, k,
        SPLITS=triton.next_power_of_2(splits), K=triton.next_power_of_2(max(k, 1)), num_warps=1,
        **pdl.launch(),
    )  # fmt: skip
