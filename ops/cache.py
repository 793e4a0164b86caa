"""Cache-writing ops of a step: the SWA ring, paged compressed caches, and the compressor (ops_spec Group B).

Step layout (shared by every op that touches caches): a step holds `tokens` rows (T) of `seqs` sequences
(S). Rows of one sequence are contiguous with consecutive increasing positions. Per row: `positions [T]
i32`, `seq_ids [T] i32` (index into the step's sequences; -1 marks a padding row, which never writes a
cache, never reads out of bounds and outputs zeros). Per sequence: `seq_slot [S] i32` (state slot of the
request: SWA ring and compressor state), `seq_start [S] i32` (position of the chunk's first row),
`seq_end [S] i32` (one past its last position), `block_table [S, nb] i32` (physical blocks of the paged
caches; entry g lives at pool[block_table[s, g // bs], g % bs]; -1 = unallocated).
"""

from __future__ import annotations

from dsgraph.graph.op import NoParams, ShapeError, declare_op, params
from dsgraph.graph.types import Dim, TensorType
from dsgraph.ops import rules as R

__all__ = [
    "CompressParams",
    "compress",
    "paged_write",
    "require_index",
    "require_pool",
    "require_seq_vectors",
    "swa_write",
]

ACTIVATION_DTYPES = ("f32", "bf16", "f16")


def require_index(t: TensorType, length: Dim, what: str, dtype: str = "i32") -> None:
    """`t` is a rank-1 `dtype` vector of `length` entries (a per-row or per-sequence step operand)."""
    R.require_dtype(t, (dtype,), what)
    R.require_rank(t, 1, what)
    R.require_dim(t.shape[0], length, f"length of {what} {t}")


def require_seq_vectors(*named: tuple[TensorType, str]) -> Dim:
    """Per-sequence operands: rank-1 i32 vectors of one common length `seqs`, which is returned."""
    first, first_name = named[0]
    R.require_dtype(first, ("i32",), first_name)
    R.require_rank(first, 1, first_name)
    for t, name in named[1:]:
        require_index(t, first.shape[0], name)
    return first.shape[0]


def require_pool(t: TensorType, entry_size: Dim | None, what: str) -> None:
    """`t` is a u8 cache pool `[slots_or_blocks, rows, entry_bytes]`; entry_bytes checked when given."""
    R.require_dtype(t, ("u8",), what)
    R.require_rank(t, 3, what)
    if entry_size is not None:
        R.require_dim(t.shape[2], entry_size, f"entry bytes of {what} {t}")


def _swa_write_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    ring, entries, positions, seq_ids, seq_slot, seq_end = ts
    require_pool(ring, None, "ring")
    R.require_dtype(entries, ("u8",), "entries")
    R.require_rank(entries, 2, "entries")
    R.require_dim(entries.shape[1], ring.shape[2], f"entry bytes of entries {entries} vs ring {ring}")
    rows = entries.shape[0]
    require_index(positions, rows, "positions")
    require_index(seq_ids, rows, "seq_ids")
    require_seq_vectors((seq_slot, "seq_slot"), (seq_end, "seq_end"))
    return (ring,)


swa_write = declare_op(
    "swa_write",
    NoParams,
    _swa_write_rule,
    "`ring [slots, R, B] u8, entries [tokens, B] u8, positions [tokens] i32, seq_ids [tokens] i32, "
    "seq_slot [seqs] i32, seq_end [seqs] i32` -> `ring' [slots, R, B] u8`: row t of sequence s = seq_ids[t] "
    "at position p is written to ring[seq_slot[s], p % R] when it is a real row (seq_ids[t] >= 0) and "
    "p >= seq_end[s] - R (only the chunk's last R positions survive, so no ring row is written twice); "
    "every other ring row is unchanged. Two kept rows aimed at the same ring row is an error naming both.",
    num_inputs=6,
)


def _paged_write_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    pool, entries, entry_ids, valid, seq_ids, block_table = ts
    require_pool(pool, None, "pool")
    R.require_dtype(entries, ("u8",), "entries")
    R.require_rank(entries, 2, "entries")
    R.require_dim(entries.shape[1], pool.shape[2], f"entry bytes of entries {entries} vs pool {pool}")
    rows = entries.shape[0]
    require_index(entry_ids, rows, "entry_ids")
    require_index(valid, rows, "valid", dtype="bool")
    require_index(seq_ids, rows, "seq_ids")
    R.require_dtype(block_table, ("i32",), "block_table")
    R.require_rank(block_table, 2, "block_table")
    return (pool,)


paged_write = declare_op(
    "paged_write",
    NoParams,
    _paged_write_rule,
    "`pool [blocks, bs, B] u8, entries [tokens, B] u8, entry_ids [tokens] i32, valid [tokens] bool, "
    "seq_ids [tokens] i32, block_table [seqs, nb] i32` -> `pool' [blocks, bs, B] u8`: for every row t with "
    "valid[t] and seq_ids[t] = s >= 0, entry g = entry_ids[t] goes to pool[block_table[s, g // bs], g % bs]; "
    "other rows write nothing. g < 0, g // bs >= nb, an unallocated block (-1) or a block id >= blocks is "
    "an error naming the row, sequence and entry, and so is a pool row written twice in one step.",
    num_inputs=6,
)


@params
class CompressParams:
    ratio: int
    out_dtype: str = "f32"  # of latent: its projections and pooling are f32, rounded once on the way out


def _compress_rule(p: CompressParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if p.ratio not in (1, 2):
        raise ShapeError(f"param ratio is {p.ratio}, expected 1 or 2")
    want = 6 if p.ratio == 1 else 8
    if len(ts) != want:
        raise ShapeError(f"ratio {p.ratio} takes {want} operands, got {len(ts)}")
    if p.out_dtype not in ACTIVATION_DTYPES:
        raise ShapeError(f"param out_dtype is {p.out_dtype!r}, expected one of {list(ACTIVATION_DTYPES)}")
    u, wkv = ts[0], ts[1]
    R.require_dtype(u, ACTIVATION_DTYPES, "u")
    R.require_rank(u, 2, "u")
    rows, hidden = u.shape
    for w, name in ((wkv, "wkv"), *(((ts[2], "wgate"),) if p.ratio == 2 else ())):
        R.require_dtype(w, ACTIVATION_DTYPES, name)
        R.require_rank(w, 2, name)
        R.require_dim(w.shape[1], hidden, f"in-features of {name} {w} vs u {u}")
    width = wkv.shape[0]
    if p.ratio == 2:
        R.require_dim(ts[2].shape[0], width, f"rows of wgate {ts[2]} vs wkv {wkv}")
        state = ts[3]
        R.require_dtype(state, ("f32",), "state")
        R.require_rank(state, 4, "state")
        if isinstance(state.shape[1], int) and state.shape[1] < 1:
            raise ShapeError(f"ring length (dim 1) of state {state} must be positive")
        R.require_dim(state.shape[2], 2, f"dim 2 of state {state} (wkv and wgate projections)")
        R.require_dim(state.shape[3], width, f"width of state {state} vs wkv {wkv}")
    positions, seq_ids, seq_slot, seq_start = ts[-4:]
    require_index(positions, rows, "positions")
    require_index(seq_ids, rows, "seq_ids")
    require_seq_vectors((seq_slot, "seq_slot"), (seq_start, "seq_start"))
    outs = (TensorType((rows, width), p.out_dtype), TensorType((rows,), "bool"))
    return outs + ((ts[3],) if p.ratio == 2 else ())


compress = declare_op(
    "compress",
    CompressParams,
    _compress_rule,
    "ratio 1: `u [tokens, H] float, wkv [D, H] float, positions [tokens] i32, seq_ids [tokens] i32, "
    "seq_slot [seqs] i32, seq_start [seqs] i32` -> `(latent [tokens, D] out_dtype, closes [tokens] bool)`: "
    "latent_t = wkv . u_t, closes = real rows. "
    "ratio 2: `u, wkv, wgate [D, H] float, state [slots, C, 2, D] f32, positions, seq_ids, seq_slot, "
    "seq_start` -> `(latent, closes, state' [slots, C, 2, D] f32)`: group g = positions {2g, 2g+1}; a real "
    "row at odd p closes group (p-1)/2 with latent = sum over its two tokens of "
    "softmax_over_tokens(wgate . u) * (wkv . u) per channel, the first token's projections coming from the "
    "previous row of the chunk or, when p == seq_start, from state[seq_slot, (p-1) % C] ([0] = wkv . u, "
    "[1] = wgate . u). state is a ring of the C newest positions' projections: state' stores each real "
    "row's projections at [seq_slot, p % C] when p is among the last C positions of its sequence's chunk "
    "(so no ring row is written twice); everything else is unchanged. A verify step's rejected rows "
    "therefore leave the entry of every committed position younger than C alone: rollback is only the "
    "committed length. Rows that close nothing (and padding rows) give latent 0, closes False. f32 math "
    "(u and the weights read as f32; latent rounded to out_dtype once, at the end); each row's projection "
    "is computed on its own, so results do not depend on how rows are batched.",
)
