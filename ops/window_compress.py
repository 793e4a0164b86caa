"""The DeepSeek-V4 compressor: softmax pooling of windows of `ratio` tokens with a learned position bias,
optionally overlapping (each entry also pools the previous window through a second projection series).

Operands follow the step layout of `dsgraph.ops.cache`. Entry w of a sequence summarises the window of
positions w*ratio .. w*ratio + ratio - 1 and is produced by the row that closes it (position
w*ratio + ratio - 1).
"""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import TensorType
from dsgraph.ops import rules as R
from dsgraph.ops.cache import ACTIVATION_DTYPES, require_index, require_seq_vectors

__all__ = [
    "VisibleEntriesParams",
    "WindowCompressParams",
    "visible_entries",
    "window_compress",
    "window_span",
]


@params
class WindowCompressParams:
    ratio: int
    overlap: bool


def window_span(ratio: int, overlap: bool) -> int:
    """Positions one entry pools: its window, plus the previous window when overlapping."""
    return ratio * (2 if overlap else 1)


def _window_compress_rule(p: WindowCompressParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if not isinstance(p.ratio, int) or isinstance(p.ratio, bool) or p.ratio < 2:
        raise ShapeError(f"param ratio is {p.ratio!r}, expected an int >= 2")
    u, wkv, wgate, ape, state, positions, seq_ids, seq_slot, seq_start = ts
    R.require_dtype(u, ("f32",), "u")
    R.require_rank(u, 2, "u")
    rows, hidden = u.shape
    for w, name in ((wkv, "wkv"), (wgate, "wgate")):
        R.require_dtype(w, ACTIVATION_DTYPES, name)
        R.require_rank(w, 2, name)
        R.require_dim(w.shape[1], hidden, f"in-features of {name} {w} vs u {u}")
    width = wkv.shape[0]
    R.require_dim(wgate.shape[0], width, f"rows of wgate {wgate} vs wkv {wkv}")
    if p.overlap and (not isinstance(width, int) or width % 2):
        raise ShapeError(f"rows of wkv {wkv} must be even with overlap (two series of width/2)")
    R.require_dtype(ape, ("f32",), "ape")
    if ape.shape != (p.ratio, width):
        raise ShapeError(f"ape is {ape}, expected shape {(p.ratio, width)}")
    R.require_dtype(state, ("f32",), "state")
    R.require_rank(state, 4, "state")
    span = window_span(p.ratio, p.overlap)
    if isinstance(state.shape[1], int) and state.shape[1] < span:
        raise ShapeError(f"ring length (dim 1) of state {state} is below the pooled span {span}")
    R.require_dim(state.shape[2], 2, f"dim 2 of state {state} (wkv and wgate projections)")
    R.require_dim(state.shape[3], width, f"width of state {state} vs wkv {wkv}")
    require_index(positions, rows, "positions")
    require_index(seq_ids, rows, "seq_ids")
    require_seq_vectors((seq_slot, "seq_slot"), (seq_start, "seq_start"))
    out_width = width // 2 if p.overlap else width
    return TensorType((rows, out_width), "f32"), TensorType((rows,), "bool"), state


window_compress = declare_op(
    "window_compress",
    WindowCompressParams,
    _window_compress_rule,
    "`u [tokens, H] f32, wkv [W, H] float, wgate [W, H] float, ape [ratio, W] f32, state [slots, C, 2, W] "
    "f32, positions [tokens] i32, seq_ids [tokens] i32, seq_slot [seqs] i32, seq_start [seqs] i32` -> "
    "`(latent [tokens, D] f32, closes [tokens] bool, state' [slots, C, 2, W] f32)`. Per token "
    "kv = wkv . u, z = wgate . u + ape[position % ratio]. A real row at position p with "
    "(p + 1) % ratio == 0 closes window w = p // ratio: without overlap (D = W) latent = per channel "
    "sum over the window's tokens of softmax_over_tokens(z) * kv; with overlap (D = W/2) the pooled tokens "
    "are the previous window's (channels [0, D) of kv and z) and this window's (channels [D, W)), softmax "
    "over all 2*ratio of them, the previous window absent for w = 0. Projections of positions before "
    "seq_start come from state[seq_slot, position % C] ([0] = kv, [1] = wgate . u without ape); state' "
    "stores each real row's projections there when p is among the last C positions of its sequence's "
    "chunk (C >= the pooled span; rollback of fewer than C - span + 1 rows is only the committed length). "
    "Rows that close nothing (and padding rows) give latent 0, closes False. f32 math, row by row.",
    num_inputs=9,
)


@params
class VisibleEntriesParams:
    ratio: int
    width: int  # K: entries per sequence the output can list (the block table's nb * bs)


def _visible_entries_rule(p: VisibleEntriesParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    positions, seq_ids = ts
    for value, what in ((p.ratio, "ratio"), (p.width, "width")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ShapeError(f"param {what} is {value!r}, expected a positive int")
    R.require_dtype(positions, ("i32",), "positions")
    R.require_rank(positions, 1, "positions")
    require_index(seq_ids, positions.shape[0], "seq_ids")
    return (TensorType((positions.shape[0], p.width), "i32"),)


visible_entries = declare_op(
    "visible_entries",
    VisibleEntriesParams,
    _visible_entries_rule,
    "`positions [tokens] i32, seq_ids [tokens] i32` -> `ids [tokens, width] i32`: row t at position p lists "
    "the compressed entries 0 .. min((p + 1) // ratio, width) - 1 in order, then -1; padding rows (seq_ids "
    "-1) list none. The selection of an attention that reads every visible entry (V4's HCA layers).",
    num_inputs=2,
)
