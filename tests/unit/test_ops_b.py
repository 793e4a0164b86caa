"""Group B ops (swa_write, compress, paged_write, index_scores, candidate_mask, topk_select, attention):
shape rules, and edge cases (padding rows, chunk boundaries, ring wrap, unallocated blocks, empty
selections, ties) against small hand references. Chunking invariance: test_ops_b_chunking.py.
"""

from __future__ import annotations

import math

import pytest
import torch

import dsgraph.ops  # noqa: F401
from dsgraph.graph import ShapeError, TensorType, make_graph
from dsgraph.ops import attention as A
from dsgraph.ops import cache as K
from dsgraph.platform.cpu import cache_format as CF
from dsgraph.platform.cpu.interpret import ExecutionError
from dsgraph.platform.cpu.quant import fp8_g32_qdq, mxfp4_g32_qdq, nvfp4_g16_qdq
from tests.unit import ops_b_refs as refs

T, S = "tokens", "seqs"
NEG_INF = float("-inf")

tt, i32, run1 = refs.tt, refs.i32, refs.run1


# ---------------------------------------------------------------------------------------------- shape rules

SWA = [tt((3, 14, 66), "u8"), tt((T, 66), "u8"), tt((T,)), tt((T,)), tt((S,)), tt((S,))]
PAGED = [tt((9, 4, 36), "u8"), tt((T, 36), "u8"), tt((T,)), tt((T,), "bool"), tt((T,)), tt((S, 5))]
COMPRESS2 = [tt((T, 64), "f32"), tt((64, 64), "f32"), tt((64, 64), "f32"), tt((3, 7, 2, 64), "f32")] + [
    tt((T,)),
    tt((T,)),
    tt((S,)),
    tt((S,)),
]
INDEX = [tt((T, 4, 32), "f32"), tt((T, 4), "f32"), tt((9, 4, 17), "u8"), tt((S, 5)), tt((T,)), tt((T,))]
ATTN = [tt((T, 4, 64), "f32"), tt((T, 64), "f32"), tt((3, 14, 66), "u8"), tt((4,), "f32")] + [
    tt((T,)),
    tt((T,)),
    tt((S,)),
    tt((S,)),
    tt((S,)),
    tt((9, 4, 36), "u8"),
    tt((S, 5)),
    tt((T, 3)),
]


def _replace(types: list[TensorType], i: int, t: TensorType) -> list[TensorType]:
    return [t if j == i else x for j, x in enumerate(types)]


BAD_TYPES = [
    ("swa_write", {}, _replace(SWA, 1, tt((T, 65), "u8")), "entry bytes of entries"),
    ("swa_write", {}, _replace(SWA, 2, tt((T,), "i64")), "positions must have dtype"),
    ("swa_write", {}, _replace(SWA, 5, tt((7,))), "length of seq_end"),
    ("paged_write", {}, _replace(PAGED, 3, tt((T,), "i32")), "valid must have dtype"),
    ("paged_write", {}, _replace(PAGED, 5, tt((S,))), "block_table must have rank 2"),
    ("compress", {"ratio": 2}, _replace(COMPRESS2, 0, tt((T, 64), "i32")), "u must have dtype"),
    ("compress", {"ratio": 2, "out_dtype": "i32"}, COMPRESS2, "param out_dtype is 'i32'"),
    ("compress", {"ratio": 2}, _replace(COMPRESS2, 2, tt((64, 32), "f32")), "in-features of wgate"),
    ("compress", {"ratio": 2}, _replace(COMPRESS2, 3, tt((3, 2, 64), "f32")), "state must have rank 4"),
    ("compress", {"ratio": 3}, COMPRESS2, "param ratio is 3"),
    ("compress", {"ratio": 1}, COMPRESS2, "ratio 1 takes 6 operands"),
    ("index_scores", {"ratio": 1}, _replace(INDEX, 2, tt((9, 4, 16), "u8")), "entry bytes of keys"),
    ("index_scores", {"ratio": 1}, _replace(INDEX, 1, tt((T, 3), "f32")), "heads of w"),
    ("index_scores", {"ratio": 1}, _replace(INDEX, 3, tt((S, "nb"))), "need concrete dims"),
    ("index_scores", {"ratio": 0}, INDEX, "param ratio is 0"),
    ("candidate_mask", {"block_size": 2, "topk_blocks": 0}, [tt((T, 8), "f32")], "param topk_blocks"),
    ("topk_select", {"k": 3}, [tt((T, 8), "i32")], "scores must have dtype"),
    (
        "attention",
        {"window": 8, "softmax_scale": 0.1},
        _replace(ATTN, 1, tt((T, 32), "f32")),
        "head dim of kv",
    ),
    (
        "attention",
        {"window": 8, "softmax_scale": 0.1},
        _replace(ATTN, 2, tt((3, 14, 36), "u8")),
        "entry bytes of ring",
    ),
    ("attention", {"window": 8, "softmax_scale": 0.1}, _replace(ATTN, 3, tt((3,), "f32")), "heads of sink"),
    (
        "attention",
        {"window": 8, "softmax_scale": 0.1},
        _replace(ATTN, 9, tt((9, 4, 66), "u8")),
        "entry bytes of pool",
    ),
    ("attention", {"window": 8, "softmax_scale": 0.1}, _replace(ATTN, 10, tt((4, 5))), "rows of block_table"),
    (
        "attention",
        {"window": 8, "softmax_scale": 0.1},
        _replace(ATTN, 11, tt((T, 3), "i64")),
        "topk must have",
    ),
    ("attention", {"window": 15, "softmax_scale": 0.1}, ATTN, "ring length R .* expected >= window 15"),
    ("attention", {"window": 8, "softmax_scale": 0.1}, ATTN[:10], "takes 9 operands"),
    ("attention", {"window": 8, "softmax_scale": 0.1}, _replace(ATTN, 8, tt((7,))), "seq_window_start"),
]


@pytest.mark.parametrize(("name", "params", "types", "match"), BAD_TYPES)
def test_shape_rules_reject_bad_operands(
    name: str, params: dict, types: list[TensorType], match: str
) -> None:
    op = dsgraph.ops.op.__getattr__(name)
    with pytest.raises(ShapeError, match=f"op {name}: .*{match}"):
        make_graph(lambda *xs: op(*xs, **params), *types)


def test_shape_rules_accept_the_contract_types() -> None:
    assert make_graph(lambda *xs: K.swa_write(*xs), *SWA).outputs[0].type == SWA[0]
    assert make_graph(lambda *xs: K.paged_write(*xs), *PAGED).outputs[0].type == PAGED[0]
    lat, closes, state = make_graph(lambda *xs: K.compress(*xs, ratio=2), *COMPRESS2).outputs
    assert (lat.type, closes.type, state.type) == (tt((T, 64), "f32"), tt((T,), "bool"), COMPRESS2[3])
    ratio1 = COMPRESS2[:2] + COMPRESS2[4:]
    assert len(make_graph(lambda *xs: K.compress(*xs, ratio=1), *ratio1).outputs) == 2
    assert make_graph(lambda *xs: A.index_scores(*xs, ratio=2), *INDEX).outputs[0].type == tt((T, 20), "f32")
    topk = make_graph(lambda x: A.topk_select(x, k=5), tt((T, 8), "f32")).outputs[0].type
    assert topk == tt((T, 5), "i32")
    attn = make_graph(lambda *xs: A.attention(*xs, window=8, softmax_scale=0.1), *ATTN).outputs[0].type
    assert attn == ATTN[0]
    swa_only = make_graph(lambda *xs: A.attention(*xs, window=8, softmax_scale=0.1), *ATTN[:9])
    assert swa_only.outputs[0].type == ATTN[0]


# ------------------------------------------------------------------------------------------- cache writes


def _swa_write(
    ring: torch.Tensor, entries: torch.Tensor, pos: list[int], ids: list[int], slot: list[int], end: list[int]
) -> torch.Tensor:
    types = [
        tt(tuple(ring.shape), "u8"),
        tt((T, ring.shape[2]), "u8"),
        tt((T,)),
        tt((T,)),
        tt((S,)),
        tt((S,)),
    ]
    args = [ring, entries, i32(pos), i32(ids), i32(slot), i32(end)]
    return run1(lambda *xs: K.swa_write(*xs), types, args)["out"]


def test_swa_write_keeps_the_last_ring_length_positions_and_skips_padding() -> None:
    ring = torch.zeros(3, 4, 2, dtype=torch.uint8)
    # sequence 0 (slot 2): positions 3..9, longer than the ring; padding row; sequence 1 (slot 0): 5, 6.
    pos = [3, 4, 5, 6, 7, 8, 9, 0, 5, 6]
    ids = [0, 0, 0, 0, 0, 0, 0, -1, 1, 1]
    entries = torch.arange(1, 21, dtype=torch.uint8).view(10, 2)
    out = _swa_write(ring, entries, pos, ids, slot=[2, 0], end=[10, 7])
    want = torch.zeros_like(ring)
    for t, (p, s) in enumerate(zip(pos, ids, strict=True)):
        if s == 0 and p >= 10 - 4:
            want[2, p % 4] = entries[t]
        if s == 1:
            want[0, p % 4] = entries[t]
    assert torch.equal(out, want)
    assert torch.equal(out[1], ring[1]) and torch.equal(ring, torch.zeros_like(ring))  # operand untouched


def test_swa_write_rejects_two_rows_on_one_ring_row_and_bad_seq_ids() -> None:
    ring, entries = torch.zeros(2, 4, 2, dtype=torch.uint8), torch.ones(2, 2, dtype=torch.uint8)
    with pytest.raises(ExecutionError, match="rows 0 and 1 both write one ring row"):
        _swa_write(ring, entries, [1, 5], [0, 1], slot=[1, 1], end=[2, 6])  # two sequences share slot 1
    with pytest.raises(ExecutionError, match="row 1 has seq_id 2, expected -1 .padding. or 0..1"):
        _swa_write(ring, entries, [1, 5], [0, 2], slot=[0, 1], end=[2, 6])
    with pytest.raises(ExecutionError, match=r"seq_slot\[1\] is 5, expected 0..1"):
        _swa_write(ring, entries, [1, 5], [0, 1], slot=[0, 5], end=[2, 6])


def _paged_write(
    pool: torch.Tensor,
    entries: torch.Tensor,
    entry_ids: list[int],
    valid: list[bool],
    ids: list[int],
    table: list[list[int]],
) -> torch.Tensor:
    nb = len(table[0])
    types = [tt(tuple(pool.shape), "u8"), tt((T, pool.shape[2]), "u8"), tt((T,)), tt((T,), "bool"), tt((T,))]
    args = [
        pool,
        entries,
        i32(entry_ids),
        torch.tensor(valid),
        i32(ids),
        torch.tensor(table, dtype=torch.int32),
    ]
    return run1(lambda *xs: K.paged_write(*xs), [*types, tt((S, nb))], args)["out"]


def test_paged_write_places_entries_through_the_block_table() -> None:
    pool = torch.zeros(6, 2, 3, dtype=torch.uint8)
    table = [[4, 0, -1], [5, 2, 1]]
    entries = torch.arange(1, 16, dtype=torch.uint8).view(5, 3)
    out = _paged_write(
        pool, entries, [3, 2, 9, 5, 0], [True, True, True, True, False], [0, 0, -1, 1, 1], table
    )
    want = torch.zeros_like(pool)
    want[0, 1], want[0, 0], want[1, 1] = (
        entries[0],
        entries[1],
        entries[3],
    )  # g=3 -> block 0, g=2 -> 0, g=5 -> 1
    assert torch.equal(out, want)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (4, r"row 1 \(sequence 1\) needs entry 4, in block -1, which is unallocated"),
        (6, r"row 1 \(sequence 1\) needs entry 6, past the block table \(3 blocks of 2\)"),
        (-1, r"row 1 \(sequence 1\) needs entry -1, past the block table"),
    ],
)
def test_paged_write_errors_name_row_sequence_and_entry(entry: int, match: str) -> None:
    pool, entries = torch.zeros(6, 2, 3, dtype=torch.uint8), torch.ones(2, 3, dtype=torch.uint8)
    with pytest.raises(ExecutionError, match=match):
        _paged_write(pool, entries, [0, entry], [True, True], [0, 1], [[4, 0, 1], [5, 2, -1]])


def test_paged_write_rejects_a_pool_row_written_twice() -> None:
    pool, entries = torch.zeros(6, 2, 3, dtype=torch.uint8), torch.ones(2, 3, dtype=torch.uint8)
    with pytest.raises(ExecutionError, match="rows 0 and 1 both write one pool row"):
        _paged_write(pool, entries, [1, 3], [True, True], [0, 1], [[4, 0], [2, 4]])  # block 4 shared


# ------------------------------------------------------------------------------------------------ compress


def _compress(
    ratio: int,
    u: torch.Tensor,
    wkv: torch.Tensor,
    wgate: torch.Tensor | None,
    state: torch.Tensor | None,
    pos: list[int],
    ids: list[int],
    slot: list[int],
    start: list[int],
) -> dict[str, torch.Tensor]:
    width, hidden = wkv.shape
    types = [tt((T, hidden), "f32"), tt((width, hidden), "f32")]
    args = [u, wkv]
    if ratio == 2:
        assert wgate is not None and state is not None
        types += [tt((width, hidden), "f32"), tt(tuple(state.shape), "f32")]
        args += [wgate, state]
    types += [tt((T,)), tt((T,)), tt((S,)), tt((S,))]
    args += [i32(pos), i32(ids), i32(slot), i32(start)]
    names = ("latent", "closes", "state")

    def fn(*xs):  # type: ignore[no-untyped-def]
        return dict(zip(names, K.compress(*xs, ratio=ratio), strict=False))

    return run1(fn, types, args)


def test_compress_ratio1_projects_real_rows_only() -> None:
    gen = torch.Generator().manual_seed(1)
    u, wkv = torch.randn(4, 64, generator=gen), torch.randn(32, 64, generator=gen)
    u[2] = float("nan")  # a padding row's garbage must not leak
    got = _compress(1, u, wkv, None, None, [7, 8, 0, 3], [1, 1, -1, 0], [0, 1], [3, 7])
    assert got["closes"].tolist() == [True, True, False, True]
    torch.testing.assert_close(got["latent"][[0, 1, 3]], u[[0, 1, 3]] @ wkv.T, rtol=1e-6, atol=1e-5)
    assert torch.equal(got["latent"][2], torch.zeros(32))


def test_compress_ratio2_pools_pairs_and_carries_the_open_group() -> None:
    gen = torch.Generator().manual_seed(2)
    u = torch.randn(7, 64, generator=gen)
    wkv, wgate = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
    state = torch.full((3, 7, 2, 32), 7.0)  # a ring of 7 positions per slot
    want = refs.pool_pairs(u, wkv, wgate)
    # step 1: positions 0..2 in slot 2 (position 2 opens group 1); step 2: positions 3..6 with a padding row
    one = _compress(2, u[:3], wkv, wgate, state, [0, 1, 2], [0, 0, 0], [2], [0])
    assert one["closes"].tolist() == [False, True, False]
    torch.testing.assert_close(one["latent"][1], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(one["latent"][[0, 2]], torch.zeros(2, 32))
    torch.testing.assert_close(
        one["state"][2, :3], torch.stack([u[:3] @ wkv.T, u[:3] @ wgate.T], 1), rtol=1e-6, atol=1e-5
    )
    assert torch.equal(one["state"][:2], state[:2]) and torch.equal(one["state"][2, 3:], state[2, 3:])
    rows = torch.cat([torch.full((1, 64), float("nan")), u[3:7]])
    two = _compress(2, rows, wkv, wgate, one["state"], [99, 3, 4, 5, 6], [-1, 0, 0, 0, 0], [2], [3])
    assert two["closes"].tolist() == [False, True, False, True, False]
    torch.testing.assert_close(two["latent"][[1, 3]], want[[1, 2]], rtol=1e-5, atol=1e-5)
    assert torch.equal(two["latent"][0], torch.zeros(32))
    torch.testing.assert_close(
        two["state"][2, 3:], torch.stack([u[3:7] @ wkv.T, u[3:7] @ wgate.T], 1), rtol=1e-6, atol=1e-5
    )
    assert torch.equal(two["state"][2, :3], one["state"][2, :3])


def test_compress_state_ring_keeps_the_open_group_through_a_rollback() -> None:
    """Positions 0..4, then a verify step over 5..10 of which 5 and 6 are committed, then position 7 again
    with another token: its group pools position 6 (from the ring) with the new token, as if no row past
    6 had ever run. A chunk longer than the ring keeps only its last 7 positions."""
    gen = torch.Generator().manual_seed(4)
    u, rejected = torch.randn(8, 64, generator=gen), torch.randn(4, 64, generator=gen)
    wkv, wgate = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
    state = _compress(2, u[:5], wkv, wgate, torch.zeros(1, 7, 2, 32), [0, 1, 2, 3, 4], [0] * 5, [0], [0])[
        "state"
    ]
    verify = torch.cat([u[5:7], rejected])
    state = _compress(2, verify, wkv, wgate, state, list(range(5, 11)), [0] * 6, [0], [5])["state"]
    got = _compress(2, u[7:8], wkv, wgate, state, [7], [0], [0], [7])
    torch.testing.assert_close(got["latent"][0], refs.pool_pairs(u, wkv, wgate)[3], rtol=1e-5, atol=1e-5)
    long = _compress(
        2, torch.cat([u, u]), wkv, wgate, torch.zeros(1, 7, 2, 32), list(range(16)), [0] * 16, [0], [0]
    )
    torch.testing.assert_close(
        long["state"][0, torch.arange(9, 16) % 7],
        torch.stack([u[1:] @ wkv.T, u[1:] @ wgate.T], 1),
        rtol=1e-6,
        atol=1e-5,
    )


def test_compress_rejects_rows_that_are_not_consecutive() -> None:
    u, w, state = torch.randn(2, 64), torch.randn(32, 64), torch.zeros(1, 7, 2, 32)
    with pytest.raises(ExecutionError, match=r"row 1 \(position 3\) does not follow the row of position 2"):
        _compress(2, u, w, w, state, [1, 3], [0, 0], [0], [1])


# ------------------------------------------------------------------------------------- indexer and top-k


def _index_scores(
    ratio: int,
    q: torch.Tensor,
    w: torch.Tensor,
    keys: torch.Tensor,
    table: torch.Tensor,
    pos: list[int],
    ids: list[int],
) -> torch.Tensor:
    types = [tt((T, *q.shape[1:]), "f32"), tt((T, w.shape[1]), "f32"), tt(tuple(keys.shape), "u8")]
    types += [tt((S, table.shape[1])), tt((T,)), tt((T,))]
    args = [q, w, keys, table, i32(pos), i32(ids)]
    return run1(lambda *xs: A.index_scores(*xs, ratio=ratio), types, args)["out"]


@pytest.mark.parametrize("ratio", [1, 2])
def test_index_scores_matches_a_hand_loop_with_visibility(ratio: int) -> None:
    gen = torch.Generator().manual_seed(3)
    bs, ih, dim = 2, 3, 32
    raw = torch.randn(5, bs, dim, generator=gen)
    keys = CF.mxfp4_g32_encode(raw)
    table = torch.tensor([[3, 0, -1, 4], [1, 2, 4, 0]], dtype=torch.int32)  # seq 0: block 2 unallocated
    pos, ids = [2, 7, 0, 5, 4], [0, 0, -1, 1, 1]
    q, w = torch.randn(5, ih, dim, generator=gen), torch.randn(5, ih, generator=gen)
    got = _index_scores(ratio, q, w, keys, table, pos, ids)
    assert got.shape == (5, 8)
    for t, (p, s) in enumerate(zip(pos, ids, strict=True)):
        for g in range(8):
            block = int(table[max(s, 0), g // bs])
            if s < 0 or g >= (p + 1) // ratio or block < 0:
                assert got[t, g] == NEG_INF, (t, g)
                continue
            k = mxfp4_g32_qdq(raw[block, g % bs])
            want = sum(float(w[t, h]) * max(float(q[t, h] @ k), 0.0) for h in range(ih))
            assert math.isclose(float(got[t, g]), want, rel_tol=1e-5, abs_tol=1e-5), (t, g)


def _candidates(scores: torch.Tensor, block_size: int, topk_blocks: int) -> torch.Tensor:
    fn = lambda x: A.candidate_mask(x, block_size=block_size, topk_blocks=topk_blocks)  # noqa: E731
    return run1(fn, [tt((T, scores.shape[1]), "f32")], [scores])["out"]


def _topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    return run1(lambda x: A.topk_select(x, k=k), [tt((T, scores.shape[1]), "f32")], [scores])["out"]


def test_candidate_mask_forces_the_newest_block_and_keeps_the_best() -> None:
    inf = NEG_INF
    scores = torch.tensor(
        [
            [
                5.0,
                1.0,
                0.0,
                9.0,
                2.0,
                2.0,
                0.5,
                inf,
            ],  # newest visible entry 6 -> block 3 forced; best: block 1
            [5.0, 1.0, 0.0, 0.0, 2.0, 2.0, 0.0, inf],  # forced block 3, then block 0 (5) beats block 2 (2)
            [inf] * 8,  # nothing visible (padding row or no complete group yet)
            [3.0, inf, inf, inf, inf, inf, inf, inf],  # only block 0 visible
            [
                1.0,
                1.0,
                7.0,
                inf,
                4.0,
                inf,
                inf,
                inf,
            ],  # newest entry 4 (block 2); entry 3 invisible in a kept block
        ]
    )
    got = _candidates(scores, block_size=2, topk_blocks=2)
    want = [
        [False, False, True, True, False, False, True, False],
        [True, True, False, False, False, False, True, False],
        [False] * 8,
        [True] + [False] * 7,
        [False, False, True, False, True, False, False, False],
    ]
    assert got.tolist() == want


def test_candidate_mask_pads_a_partial_last_block_and_breaks_ties_by_lowest_block() -> None:
    scores = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    got = _candidates(scores, block_size=2, topk_blocks=2)  # blocks {0,1}, {2,3}, {4}: block 2 forced
    assert got.tolist() == [[True, True, False, False, True]] * 2
    assert _candidates(scores, block_size=2, topk_blocks=9).all()


def test_topk_select_orders_ties_absent_and_oversized_k() -> None:
    inf = NEG_INF
    scores = torch.tensor(
        [
            [0.0, 3.0, 0.0, 3.0, 1.0, 0.0],  # ties at 3 and at 0: lowest indices win
            [inf, 2.0, inf, inf, inf, 1.0],  # two visible entries only
            [inf] * 6,
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    assert _topk(scores, 3).tolist() == [[1, 3, 4], [1, 5, -1], [-1, -1, -1], [0, 1, 2]]
    assert _topk(scores, 8).tolist()[0] == [0, 1, 2, 3, 4, 5, -1, -1]
    assert _topk(scores, 8).dtype == torch.int32


# ----------------------------------------------------------------------------------------------- attention


def _attention(args: list[torch.Tensor], window: int, scale: float) -> torch.Tensor:
    types = [
        tt((T, *args[0].shape[1:]), "f32"),
        tt((T, args[1].shape[1]), "f32"),
        tt(tuple(args[2].shape), "u8"),
    ]
    types += [tt(tuple(args[3].shape), "f32"), tt((T,)), tt((T,)), tt((S,)), tt((S,)), tt((S,))]
    if len(args) == 12:
        types += [tt(tuple(args[9].shape), "u8"), tt((S, args[10].shape[1])), tt((T, args[11].shape[1]))]
    return run1(lambda *xs: A.attention(*xs, window=window, softmax_scale=scale), types, args)["out"]


def test_attention_reads_chunk_rows_ring_and_selected_entries() -> None:
    gen = torch.Generator().manual_seed(4)
    nh, hd, window, ring_len, scale = 2, 64, 4, 5, 0.125
    history = torch.randn(2, 9, hd, generator=gen)  # raw SWA keys of two sequences, positions 0..8
    ring = torch.zeros(3, ring_len, hd + hd // 32, dtype=torch.uint8)
    for s, slot, cached in ((0, 2, 6), (1, 0, 2)):  # sequence 0 cached 0..5, sequence 1 cached 0..1
        for pos in range(max(0, cached - ring_len), cached):
            ring[slot, pos % ring_len] = CF.fp8_g32_encode(history[s, pos])
    compressed = torch.randn(4, 2, hd, generator=gen)
    pool = CF.nvfp4_g16_encode(compressed)
    table = torch.tensor([[3, 1, -1], [0, 2, -1]], dtype=torch.int32)
    pos, ids = [6, 7, 8, 0, 2], [0, 0, 0, -1, 1]  # rows 0-2: sequence 0; row 3: padding; row 4: sequence 1
    topk = torch.tensor([[0, 3, -1], [-1, -1, -1], [2, 0, 1], [5, 9, 9], [1, -1, -1]], dtype=torch.int32)
    q = torch.randn(5, nh, hd, generator=gen)
    q[3] = float("nan")
    kv = fp8_g32_qdq(torch.stack([history[0, 6], history[0, 7], history[0, 8], history[0, 0], history[1, 2]]))
    sink = torch.randn(nh, generator=gen)
    args = [q, kv, ring, sink, i32(pos), i32(ids), i32([2, 0]), i32([6, 2]), i32([0, 0]), pool, table, topk]
    got = _attention(args, window, scale)
    for t, (p, s) in enumerate(zip(pos, ids, strict=True)):
        if s < 0:
            assert torch.equal(got[t], torch.zeros(nh, hd))
            continue
        swa = [fp8_g32_qdq(history[s, x]) for x in range(max(0, p - window + 1), p + 1)]
        sel = [nvfp4_g16_qdq(compressed[int(table[s, g // 2]), g % 2]) for g in topk[t].tolist() if g >= 0]
        want = refs.attend(q[t], torch.stack(swa + sel), sink, scale)
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-6)
    swa_only = _attention(args[:9], window, scale)
    want = refs.attend(q[4], torch.stack([fp8_g32_qdq(history[1, x]) for x in range(3)]), sink, scale)
    torch.testing.assert_close(swa_only[4], want, rtol=1e-5, atol=1e-6)


def test_attention_reads_no_swa_key_below_seq_window_start() -> None:
    """A prefix hit's replay start: SWA keys below seq_window_start (a reused ring slot's stale entries)
    are not keys, whatever the ring holds there; keys at or above it and compressed entries still count."""
    gen = torch.Generator().manual_seed(6)
    nh, hd, window, ring_len, scale = 2, 64, 6, 8, 0.125
    history = torch.randn(12, hd, generator=gen)  # this request's SWA keys, positions 0..11
    first = 8  # replay start: the ring holds this request's keys from position 8 on
    ring = CF.fp8_g32_encode(torch.randn(1, ring_len, hd, generator=gen))  # stale: another request's
    for pos in range(first, 10):  # positions 8, 9 written by an earlier replay chunk
        ring[0, pos % ring_len] = CF.fp8_g32_encode(history[pos])
    compressed = torch.randn(2, 2, hd, generator=gen)
    pool, table = CF.nvfp4_g16_encode(compressed), torch.tensor([[1, 0]], dtype=torch.int32)
    pos = [10, 11]  # this chunk: positions 10, 11 (seq_start 10); windows reach back to 5 and 6
    topk = torch.tensor([[0, 3], [2, -1]], dtype=torch.int32)
    q, sink = torch.randn(2, nh, hd, generator=gen), torch.randn(nh, generator=gen)
    kv = fp8_g32_qdq(history[10:12])
    per_seq = [i32([0]), i32([10]), i32([first])]
    args = [q, kv, ring, sink, i32(pos), i32([0, 0]), *per_seq, pool, table, topk]
    got = _attention(args, window, scale)
    for t, p in enumerate(pos):
        swa = [fp8_g32_qdq(history[x]) for x in range(max(first, p - window + 1), p + 1)]
        sel = [nvfp4_g16_qdq(compressed[int(table[0, g // 2]), g % 2]) for g in topk[t].tolist() if g >= 0]
        want = refs.attend(q[t], torch.stack(swa + sel), sink, scale)
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-6)
    below, kept = ring.clone(), ring.clone()
    for x in range(4, first):  # positions 4..7: inside the windows, below the replay start
        below[0, x % ring_len] = CF.fp8_g32_encode(100 * torch.randn(hd, generator=gen))
    kept[0, first % ring_len] = CF.fp8_g32_encode(100 * torch.randn(hd, generator=gen))
    assert torch.equal(_attention([*args[:2], below, *args[3:]], window, scale), got)
    assert not torch.equal(_attention([*args[:2], kept, *args[3:]], window, scale), got)
    at_zero = _attention([*args[:8], i32([0]), *args[9:]], window, scale)  # control: the stale keys count
    assert not torch.equal(at_zero, got)


def test_attention_keeps_bf16_queries_in_bf16_and_computes_in_f32() -> None:
    gen = torch.Generator().manual_seed(5)
    hd = 64
    q, kv = torch.randn(3, 2, hd, generator=gen).bfloat16(), torch.randn(3, hd, generator=gen).bfloat16()
    ring = torch.zeros(1, 4, hd + 2, dtype=torch.uint8)
    rest = [ring, torch.randn(2, generator=gen), i32([0, 1, 2]), i32([0, 0, 0]), i32([0]), i32([0]), i32([0])]
    types = [tt((T, 2, hd), "bf16"), tt((T, hd), "bf16"), tt((1, 4, hd + 2), "u8"), tt((2,), "f32")]
    types += [tt((T,)), tt((T,)), tt((S,)), tt((S,)), tt((S,))]
    fn = lambda *xs: A.attention(*xs, window=4, softmax_scale=0.125)  # noqa: E731
    got = run1(fn, types, [q, kv, *rest])["out"]
    want = _attention([q.float(), kv.float(), *rest], 4, 0.125)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.bfloat16())


def test_attention_errors_on_a_selected_entry_in_an_unallocated_block() -> None:
    hd = 64
    ring = torch.zeros(1, 4, hd + 2, dtype=torch.uint8)
    pool = torch.zeros(2, 2, hd // 2 + hd // 16, dtype=torch.uint8)
    args = [
        torch.randn(1, 1, hd),
        torch.randn(1, hd),
        ring,
        torch.zeros(1),
        i32([3]),
        i32([0]),
        i32([0]),
        i32([3]),
        i32([0]),
        pool,
        torch.tensor([[1, -1]], dtype=torch.int32),
        torch.tensor([[1, 2]], dtype=torch.int32),
    ]
    with pytest.raises(ExecutionError, match=r"row 0 \(sequence 0\) needs entry 2, in block -1"):
        _attention(args, 4, 0.1)
