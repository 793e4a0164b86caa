"""The hidden-state ring of a V4 MTP drafter: each row's previous-position hidden state.

An MTP layer pairs the token of position p with the target's final hidden state at position p - 1. Within
a step that is the previous row of the same sequence; for a chunk's first row (and for a draft pass, whose
only row is the anchor) it was computed by an earlier step and kept in a per-slot ring of f32 entries
(`cache_encode(fmt="f32")`, written by `swa_write`). Operands follow the step layout of `dsgraph.ops.cache`.
"""

from __future__ import annotations

from dsgraph.graph.op import NoParams, ShapeError, declare_op
from dsgraph.graph.types import TensorType
from dsgraph.ops import rules as R
from dsgraph.ops.cache import require_index, require_pool, require_seq_vectors

__all__ = ["prev_hidden"]


def _prev_hidden_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if len(ts) not in (5, 6):
        raise ShapeError(f"prev_hidden takes 5 operands (ring only) or 6 (with hidden), got {len(ts)}")
    ring, positions, seq_ids, seq_slot, seq_start = ts[:5]
    require_pool(ring, None, "ring")
    entry = ring.shape[2]
    if not isinstance(entry, int) or entry % 4:
        raise ShapeError(f"entry bytes of ring {ring} must be a multiple of 4 (f32 entries)")
    R.require_dtype(positions, ("i32",), "positions")
    R.require_rank(positions, 1, "positions")
    rows = positions.shape[0]
    require_index(seq_ids, rows, "seq_ids")
    require_seq_vectors((seq_slot, "seq_slot"), (seq_start, "seq_start"))
    if len(ts) == 6:
        hidden = ts[5]
        R.require_dtype(hidden, ("f32",), "hidden")
        R.require_rank(hidden, 2, "hidden")
        R.require_dim(hidden.shape[0], rows, f"rows of hidden {hidden} vs positions {positions}")
        R.require_dim(hidden.shape[1], entry // 4, f"width of hidden {hidden} vs ring {ring} (4 bytes each)")
    return (TensorType((rows, entry // 4), "f32"),)


prev_hidden = declare_op(
    "prev_hidden",
    NoParams,
    _prev_hidden_rule,
    "`ring [slots, R, 4W] u8, positions [tokens] i32, seq_ids [tokens] i32, seq_slot [seqs] i32, "
    "seq_start [seqs] i32[, hidden [tokens, W] f32]` -> `prev [tokens, W] f32`: for a real row t of "
    "sequence s at position p, the hidden state of position p - 1: hidden[t - 1] when hidden is given and "
    "p > seq_start[s] (the previous row of the chunk, which must hold position p - 1 of s), else the f32 "
    "entry ring[seq_slot[s], (p - 1) % R]; zeros at p = 0 and on padding rows.",
    num_inputs=None,
)
