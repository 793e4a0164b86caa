"""Sparse attention ops of V4.1 (spec model-v41 4.5, ops_spec Group B): indexer scores, candidate blocks,
top-k selection and the attention over SWA keys plus selected compressed entries, with a sink.

Operands follow the step layout described in `dsgraph.ops.cache`. Entry indices g count compressed
entries of one sequence (entry g summarises positions g*ratio .. g*ratio + ratio - 1).
"""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import TensorType
from dsgraph.ops import rules as R
from dsgraph.ops.cache import ACTIVATION_DTYPES, require_index, require_pool, require_seq_vectors
from dsgraph.ops.quant import check_width, entry_bytes

__all__ = [
    "AttentionParams",
    "CandidateParams",
    "IndexScoresParams",
    "TopkParams",
    "attention",
    "candidate_mask",
    "index_scores",
    "topk_select",
]


def _require_positive(value: int, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"param {what} is {value!r}, expected a positive int")


def _require_block_table(block_table: TensorType, seqs: object | None) -> None:
    R.require_dtype(block_table, ("i32",), "block_table")
    R.require_rank(block_table, 2, "block_table")
    if seqs is not None:
        R.require_dim(block_table.shape[0], seqs, f"rows of block_table {block_table} (one per sequence)")


@params
class IndexScoresParams:
    ratio: int
    key_fmt: str = "mxfp4_g32"  # format of the index-key entries (f32: an unquantized cache)


def _index_scores_rule(p: IndexScoresParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    q, w, keys, block_table, positions, seq_ids = ts
    _require_positive(p.ratio, "ratio")
    R.require_dtype(q, ACTIVATION_DTYPES, "q")
    R.require_rank(q, 3, "q")
    rows, heads, width = q.shape
    check_width(p.key_fmt, width, f"index head dim of q {q}")
    R.require_dtype(w, ACTIVATION_DTYPES, "w")
    R.require_rank(w, 2, "w")
    R.require_dim(w.shape[0], rows, f"tokens of w {w} vs q {q}")
    R.require_dim(w.shape[1], heads, f"heads of w {w} vs q {q}")
    require_pool(keys, entry_bytes(p.key_fmt, width), "keys")
    _require_block_table(block_table, None)
    require_index(positions, rows, "positions")
    require_index(seq_ids, rows, "seq_ids")
    num_blocks, block_size = block_table.shape[1], keys.shape[1]
    if not isinstance(num_blocks, int) or not isinstance(block_size, int):
        raise ShapeError(
            f"entries per sequence nb*bs need concrete dims, got nb={num_blocks} "
            f"(block_table {block_table}) "
            f"and bs={block_size} (keys {keys})"
        )
    return (TensorType((rows, num_blocks * block_size), "f32"),)


index_scores = declare_op(
    "index_scores",
    IndexScoresParams,
    _index_scores_rule,
    "`q [tokens, ih, id] float, w [tokens, ih] float (read as f32), "
    "keys [blocks, bs, entry_bytes(key_fmt, id)] u8 (key_fmt entries, mxfp4_g32 by default), "
    "block_table [seqs, nb] i32, positions [tokens] i32, seq_ids [tokens] i32` -> `scores [tokens, nb*bs] "
    "f32`: for row t of sequence s at position p, score(t, g) = sum_h w[t, h] * relu(q[t, h] . k_g) with "
    "k_g the decoded entry pool[block_table[s, g // bs], g % bs], for visible entries g < (p + 1) // ratio "
    "whose block is allocated; -inf for every other entry and for every entry of a padding row. f32 math; "
    "each row is computed on its own (results do not depend on batching).",
    num_inputs=6,
)


@params
class CandidateParams:
    block_size: int
    topk_blocks: int


def _candidate_rule(p: CandidateParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    (scores,) = ts
    _require_positive(p.block_size, "block_size")
    _require_positive(p.topk_blocks, "topk_blocks")
    R.require_dtype(scores, ("f32",), "scores")
    R.require_rank(scores, 2, "scores")
    return (scores.with_dtype("bool"),)


candidate_mask = declare_op(
    "candidate_mask",
    CandidateParams,
    _candidate_rule,
    "`scores [tokens, E] f32` -> `mask [tokens, E] bool`: the hierarchical candidate pool (spec 4.5). Entry "
    "axis split into blocks of block_size (a last partial block is padded with -inf); block score = max of "
    "its "
    "entries; the block holding the newest visible entry (largest index with a score > -inf) is forced to "
    "+inf; the topk_blocks best blocks whose score is > -inf are kept (ties: lowest block index); mask = "
    "visible entries (score > -inf) of kept blocks. A row with no visible entry gives an all-False row.",
    num_inputs=1,
)


@params
class TopkParams:
    k: int


def _topk_rule(p: TopkParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    (scores,) = ts
    _require_positive(p.k, "k")
    R.require_dtype(scores, ("f32",), "scores")
    R.require_rank(scores, 2, "scores")
    return (TensorType((scores.shape[0], p.k), "i32"),)


topk_select = declare_op(
    "topk_select",
    TopkParams,
    _topk_rule,
    "`scores [tokens, E] f32` -> `ids [tokens, k] i32`: the entries with the k largest scores (ties: lowest "
    "entry index), leaving out entries whose score is -inf; the chosen entry indices come first in ascending "
    "order, and the remaining slots (fewer than k visible entries, or k > E) hold -1.",
    num_inputs=1,
)


@params
class AttentionParams:
    window: int
    softmax_scale: float
    ring_fmt: str = "fp8_g32"  # format of the SWA ring entries
    pool_fmt: str = "nvfp4_g16"  # format of the compressed entries (f32: unquantized caches)


def require_swa_operands(
    window: int, ts: tuple[TensorType, ...], *, kv_like_q: bool = False, ring_fmt: str = "fp8_g32"
) -> tuple[object, object]:
    """Check the 9 SWA operands shared by `attention` and `draft_attention` (q, kv, ring, sink, positions,
    seq_ids, seq_slot, seq_start, seq_window_start); `kv_like_q`: kv must have q's dtype. Returns (seqs,
    head dim)."""
    q, kv, ring, sink, positions, seq_ids, seq_slot, seq_start, seq_window_start = ts
    _require_positive(window, "window")
    R.require_dtype(q, ACTIVATION_DTYPES, "q")
    R.require_rank(q, 3, "q")
    rows, heads, width = q.shape
    check_width(ring_fmt, width, f"head dim of q {q}")
    R.require_dtype(kv, (q.dtype,) if kv_like_q else ACTIVATION_DTYPES, "kv")
    R.require_rank(kv, 2, "kv")
    R.require_dim(kv.shape[0], rows, f"tokens of kv {kv} vs q {q}")
    R.require_dim(kv.shape[1], width, f"head dim of kv {kv} vs q {q}")
    require_pool(ring, entry_bytes(ring_fmt, width), "ring")
    if isinstance(ring.shape[1], int) and ring.shape[1] < window:
        raise ShapeError(f"ring length R of ring {ring} is {ring.shape[1]}, expected >= window {window}")
    R.require_dtype(sink, ("f32",), "sink")
    R.require_rank(sink, 1, "sink")
    R.require_dim(sink.shape[0], heads, f"heads of sink {sink} vs q {q}")
    require_index(positions, rows, "positions")
    require_index(seq_ids, rows, "seq_ids")
    seqs = require_seq_vectors(
        (seq_slot, "seq_slot"), (seq_start, "seq_start"), (seq_window_start, "seq_window_start")
    )
    return seqs, width


def _attention_rule(p: AttentionParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if len(ts) not in (9, 12):
        raise ShapeError(f"takes 9 operands (SWA only) or 12 (with pool, block_table, topk), got {len(ts)}")
    q = ts[0]
    seqs, width = require_swa_operands(p.window, ts[:9], ring_fmt=p.ring_fmt)
    if len(ts) == 12:
        pool, block_table, topk = ts[9:]
        check_width(p.pool_fmt, width, f"head dim of q {q}")
        require_pool(pool, entry_bytes(p.pool_fmt, width), "pool")
        _require_block_table(block_table, seqs)
        R.require_dtype(topk, ("i32",), "topk")
        R.require_rank(topk, 2, "topk")
        R.require_dim(topk.shape[0], q.shape[0], f"tokens of topk {topk} vs q {q}")
    return (q,)


attention = declare_op(
    "attention",
    AttentionParams,
    _attention_rule,
    "`q [tokens, nh, hd] float, kv [tokens, hd] float (this step's SWA keys, already rounded to ring_fmt), "
    "ring [slots, R, entry_bytes(ring_fmt, hd)] u8 (ring_fmt entries, fp8_g32 by default: the ring before "
    "this step's swa_write; R >= window), "
    "sink [nh] f32, positions [tokens] i32, seq_ids [tokens] i32, seq_slot [seqs] i32, seq_start [seqs] i32, "
    "seq_window_start [seqs] i32[, pool [blocks, bs, entry_bytes(pool_fmt, hd)] u8 (pool_fmt entries, "
    "nvfp4_g16 by default), "
    "block_table [seqs, nb] i32, topk [tokens, K] i32]` -> `[tokens, nh, hd]` dtype of q. Keys of row t "
    "(sequence s, position p): the SWA positions max(0, seq_window_start[s], p - window + 1) .. p "
    "(seq_window_start: the first position whose SWA key the sequence holds, e.g. its replay start after a "
    "prefix-cache hit; a slot's ring below it may hold another request's keys), read from kv rows of this "
    "chunk when >= seq_start[s], else decoded from "
    "ring[seq_slot[s], pos % R]; then the compressed entries g = topk[t, j] >= 0 decoded from "
    "pool[block_table[s, g // bs], g % bs] (nothing de-duplicated). logits = (q_h . k) * softmax_scale; "
    "P = exp(logit) / (sum over keys of exp(logit) + exp(sink_h)); out_h = sum P * k (V = K). f32 math; "
    "padding rows give zeros; a selected entry in an unallocated block is an error naming the row and entry.",
)
