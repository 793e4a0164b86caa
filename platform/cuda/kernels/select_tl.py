"""The indexer's selections in Triton (rules in indexer.py, which imports this lazily): `topk_select`'s k
largest entries of a row and `candidate_mask`'s top blocks, exact, without a sort.

A row's k-th largest key is found by a radix select: each f32 score becomes a 32-bit key in the order of
the cpu rule's stable descending sort (NaN above everything, as torch sorts it; -0 equal to +0), and four
passes over the row, each a 256-bin histogram of the next 8 bits among the entries that still match the
key's prefix, fix the key's bits from the top. The chosen entries are then every entry above that key and
the lowest-indexed entries equal to it, up to k; NaN and -inf entries take their places in that order
but are never output, as the cpu rule drops them after its sort. One program per row: a row's result
never depends on the batch. Loops over runtime bounds are while loops: Triton's interpreter cannot take
range() of one. Keys are int64 (the unsigned 32-bit key, so shifts and compares are plain).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl

NAN_KEY: tl.constexpr = tl.constexpr(0xFFFFFFFF)  # every NaN: above +inf's key
NEG_INF_KEY: tl.constexpr = tl.constexpr(0x007FFFFF)  # -inf's key: the lowest a number has


@triton.jit
def _keys(ptr, offs, mask):
    """Order-preserving unsigned keys of the f32 scores at `offs` (out of range: -inf's key)."""
    x = tl.load(ptr + offs, mask=mask, other=float("-inf"))
    x = tl.where(x == 0.0, 0.0, x)  # -0 and +0 compare equal in the cpu rule: one key
    bits = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    # a negative number's bits count down as it falls: flip them all; a positive one's: set the top bit
    key = tl.where(bits >= 0x80000000, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    return tl.where(x != x, NAN_KEY, key)


@triton.jit
def _output(key):
    """Whether a chosen entry of this key is output (the cpu rule drops NaN and -inf after choosing)."""
    return (key > NEG_INF_KEY) & (key != NAN_KEY)


@triton.jit
def kth_key(ptr, width, k, BLOCK: tl.constexpr):
    """(key, room, all): the key of the row's k-th largest entry, how many entries equal to it are
    chosen (the lowest-indexed first), and whether every entry is chosen (width <= k)."""
    prefix = tl.zeros((), dtype=tl.int64)
    need = k + tl.zeros((), dtype=tl.int32)
    digit_ids = tl.arange(0, 256)
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        hist = tl.zeros((256,), dtype=tl.int32)
        start = 0
        while start < width:
            offs = start + tl.arange(0, BLOCK)
            real = offs < width
            key = _keys(ptr, offs, real)
            if p > 0:
                real &= (key >> (shift + 8)) == (prefix >> (shift + 8))
            hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=real)
            start += BLOCK
        # entries of the prefix with this digit or a larger one
        at_least = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        digit = tl.max(tl.where(at_least >= need, digit_ids, 0), axis=0)
        need -= tl.sum(tl.where(digit_ids > digit, hist, 0), axis=0)
        prefix |= digit.to(tl.int64) << shift
    return prefix, need, width <= k


@triton.jit
def _chosen(key, real, kth, room, ties_before, every):
    """Which of a tile's entries are chosen and output (never NaN or -inf), and how many of the tile's
    entries tie with the k-th key."""
    tied = real & (key == kth)
    rank = ties_before + tl.cumsum(tied.to(tl.int32), axis=0)
    chosen = real & ((key > kth) | (tied & (rank <= room)) | every)
    return chosen & _output(key), tl.sum(tied.to(tl.int32), axis=0)


@triton.jit
def topk_select_kernel(scores_ptr, out_ptr, width, k, BLOCK: tl.constexpr, PDL: tl.constexpr = False) -> None:
    """out[row, :k]: the chosen entries' indices in ascending order, then -1."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    ptr = scores_ptr + row * width
    kth, room, every = kth_key(ptr, width, k, BLOCK)
    written = tl.zeros((), dtype=tl.int32)
    ties = tl.zeros((), dtype=tl.int32)
    start = 0
    while start < width:
        offs = start + tl.arange(0, BLOCK)
        real = offs < width
        key = _keys(ptr, offs, real)
        shown, tied = _chosen(key, real, kth, room, ties, every)
        place = written + tl.cumsum(shown.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + row * k + place, offs.to(tl.int32), mask=shown)
        written += tl.sum(shown.to(tl.int32), axis=0)
        ties += tied
        start += BLOCK
    start = 0
    while start < k:
        place = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + row * k + place, -1, mask=(place >= written) & (place < k))
        start += BLOCK


@triton.jit
def block_scores_kernel(
    scores_ptr,
    out_ptr,
    width,
    num_blocks,
    block_size,
    BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
) -> None:
    """out[row, b]: the largest score of block b (entries past the row: -inf; NaN if one is NaN), +inf
    for the block of the row's newest visible (> -inf) entry."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    ptr = scores_ptr + row * width
    newest = tl.full((), -1, dtype=tl.int32)
    start = 0
    while start < width:
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(ptr + offs, mask=offs < width, other=float("-inf"))
        newest = tl.maximum(newest, tl.max(tl.where(x > float("-inf"), offs, -1), axis=0))
        start += BLOCK
    rows_b: tl.constexpr = BLOCK // BLOCK_S
    j = tl.arange(0, BLOCK_S)
    start = 0
    while start < num_blocks:
        b = start + tl.arange(0, rows_b)
        e = b[:, None] * block_size + j[None, :]
        real = (j[None, :] < block_size) & (e < width)
        x = tl.load(ptr + e, mask=real, other=float("-inf"))
        nan = tl.max((x != x).to(tl.int32), axis=1) > 0
        best = tl.max(tl.where(x != x, float("-inf"), x), axis=1)
        best = tl.where(nan, float("nan"), best)
        best = tl.where((newest >= 0) & (b == newest // block_size), float("inf"), best)
        tl.store(out_ptr + row * num_blocks + b, best, mask=b < num_blocks)
        start += rows_b


@triton.jit
def block_mask_kernel(
    block_ptr,
    scores_ptr,
    out_ptr,
    width,
    num_blocks,
    block_size,
    k,
    BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
) -> None:
    """out[row, e] (bytes of a bool tensor): entry e is visible (> -inf) and its block is one of the k
    chosen from the row's block scores."""
    pdl_tl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    ptr = block_ptr + row * num_blocks
    kth, room, every = kth_key(ptr, num_blocks, k, BLOCK)
    ties = tl.zeros((), dtype=tl.int32)
    rows_b: tl.constexpr = BLOCK // BLOCK_S
    j = tl.arange(0, BLOCK_S)
    start = 0
    while start < num_blocks:
        b = start + tl.arange(0, rows_b)
        real = b < num_blocks
        key = _keys(ptr, b, real)
        keep, tied = _chosen(key, real, kth, room, ties, every)
        ties += tied
        e = b[:, None] * block_size + j[None, :]
        inside = (j[None, :] < block_size) & (e < width)
        x = tl.load(scores_ptr + row * width + e, mask=inside, other=float("-inf"))
        tl.store(out_ptr + row * width + e, (keep[:, None] & (x > float("-inf"))).to(tl.uint8), mask=inside)
        start += rows_b


__all__ = ["block_mask_kernel", "block_scores_kernel", "kth_key", "topk_select_kernel", "triton"]
