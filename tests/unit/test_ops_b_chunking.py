"""Chunking invariance of a mini V4.1 Full layer built from the group B ops.

The mini layer chains every op like a Full layer does (compress -> encode -> paged writes -> indexer
scores -> candidates -> top-k -> attention -> SWA write). A sequence processed in one chunk, in chunks of
5 or 17 rows, or one row at a time (decode), with two sequences and padding rows per step, must give the
same outputs and caches bit for bit: every rule computes each row on its own. The one-chunk run is also
checked against hand references.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import dsgraph.ops  # noqa: F401
from dsgraph.graph import TensorType, deserialize, make_graph, serialize, verify
from dsgraph.ops import attention as A
from dsgraph.ops import cache as K
from dsgraph.ops import core as C
from dsgraph.platform.cpu import cache_format as CF
from dsgraph.platform.cpu.interpret import run_graph
from dsgraph.platform.cpu.quant import fp8_g32_qdq, nvfp4_g16_qdq
from tests.unit import ops_b_refs as refs

T, S = "tokens", "seqs"
NEG_INF = float("-inf")

tt, i32, run1 = refs.tt, refs.i32, refs.run1


@dataclass(frozen=True)
class Layer:
    """A Full layer in miniature: one compressor, index keys = the first index_dim latent channels."""

    ratio: int
    hidden: int = 64
    width: int = 64
    heads: int = 2
    index_heads: int = 3
    index_dim: int = 32
    window: int = 8
    ring_len: int = 14
    block_size: int = 4
    table_width: int = 10
    k: int = 3
    cand_block: int = 2
    cand_topk: int = 2
    slots: int = 3
    comp_ring: int = 7  # compressor state ring (ratio 2)


LENGTHS = (29, 20)
SLOT = (2, 0)
# Physical blocks of each sequence; the last two table columns stay unallocated.
TABLES = ([5, 1, 7, 9, 11, 13, 15, 17, -1, -1], [0, 2, 3, 4, 6, 8, 10, 12, -1, -1])
POOL_BLOCKS = 18
PAD_POSITION = 1000


def _make_data(layer: Layer, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = sum(LENGTHS)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    return {
        "u": randn(n, layer.hidden),
        "q": randn(n, layer.heads, layer.width),
        "kv": randn(n, layer.width),
        "qi": randn(n, layer.index_heads, layer.index_dim),
        "wi": randn(n, layer.index_heads),
        "wkv": randn(layer.width, layer.hidden, scale=layer.hidden**-0.5),
        "wgate": randn(layer.width, layer.hidden, scale=layer.hidden**-0.5),
        "sink": randn(layer.heads),
    }


def _row_of(s: int, p: int) -> int:
    return sum(LENGTHS[:s]) + p


def _compress_graph(layer: Layer):  # type: ignore[no-untyped-def]
    d, h = layer.width, layer.hidden
    types = [tt((T, h), "f32"), tt((d, h), "f32")]
    if layer.ratio == 2:
        types += [tt((d, h), "f32"), tt((layer.slots, layer.comp_ring, 2, d), "f32")]
    types += [tt((T,)), tt((T,)), tt((S,)), tt((S,))]

    def compress_step(*xs):  # type: ignore[no-untyped-def]
        return dict(zip(("latent", "closes", "state"), K.compress(*xs, ratio=layer.ratio), strict=False))

    return make_graph(compress_step, *types)


def _attend_types(layer: Layer) -> dict[str, TensorType]:
    d, ih, idim = layer.width, layer.index_heads, layer.index_dim
    swa_bytes, kv_bytes, idx_bytes = d + d // 32, d // 2 + d // 16, idim // 2 + idim // 32
    per_row = {
        "q": tt((T, layer.heads, d), "f32"),
        "kv": tt((T, d), "f32"),
        "kv_entries": tt((T, swa_bytes), "u8"),
    }
    per_row |= {"ckv_entries": tt((T, kv_bytes), "u8"), "idx_entries": tt((T, idx_bytes), "u8")}
    per_row |= {"qi": tt((T, ih, idim), "f32"), "wi": tt((T, ih), "f32"), "closes": tt((T,), "bool")}
    per_row |= {"entry_ids": tt((T,)), "positions": tt((T,)), "seq_ids": tt((T,))}
    per_seq = {
        "seq_slot": tt((S,)),
        "seq_start": tt((S,)),
        "seq_window_start": tt((S,)),
        "seq_end": tt((S,)),
        "block_table": tt((S, layer.table_width)),
    }
    caches = {"ring": tt((layer.slots, layer.ring_len, swa_bytes), "u8")}
    caches |= {"pool_kv": tt((POOL_BLOCKS, layer.block_size, kv_bytes), "u8")}
    caches |= {"pool_idx": tt((POOL_BLOCKS, layer.block_size, idx_bytes), "u8")}
    return per_row | per_seq | caches | {"sink": tt((layer.heads,), "f32"), "neg_inf": tt((), "f32")}


def _attend_graph(layer: Layer):  # type: ignore[no-untyped-def]
    def attend_step(x):  # type: ignore[no-untyped-def]
        rows = (x["positions"], x["seq_ids"])
        writes = (x["entry_ids"], x["closes"], x["seq_ids"], x["block_table"])
        pool_kv = K.paged_write(x["pool_kv"], x["ckv_entries"], *writes)
        pool_idx = K.paged_write(x["pool_idx"], x["idx_entries"], *writes)
        scores = A.index_scores(x["qi"], x["wi"], pool_idx, x["block_table"], *rows, ratio=layer.ratio)
        cand = A.candidate_mask(scores, block_size=layer.cand_block, topk_blocks=layer.cand_topk)
        topk = A.topk_select(C.where(cand, scores, x["neg_inf"]), k=layer.k)
        seqs = (x["seq_slot"], x["seq_start"], x["seq_window_start"])
        out = A.attention(
            x["q"], x["kv"], x["ring"], x["sink"], *rows, *seqs, pool_kv, x["block_table"], topk,
            window=layer.window, softmax_scale=layer.width**-0.5,
        )  # fmt: skip
        ring = K.swa_write(x["ring"], x["kv_entries"], *rows, x["seq_slot"], x["seq_end"])
        outs = {"out": out, "scores": scores, "cand": cand, "topk": topk}
        return outs | {"ring": ring, "pool_kv": pool_kv, "pool_idx": pool_idx}

    return make_graph(attend_step, _attend_types(layer))


def _step_rows(chunks: list[tuple[int, int, int]]) -> tuple[list[int], list[int], list[int]]:
    """Rows of one step: each chunk (sequence, start, end), a padding row after every chunk.
    Returns (positions, local seq ids, data rows or -1 for padding)."""
    positions, ids, data_rows = [], [], []
    for local, (s, start, end) in enumerate(chunks):
        positions += list(range(start, end)) + [PAD_POSITION]
        ids += [local] * (end - start) + [-1]
        data_rows += [_row_of(s, p) for p in range(start, end)] + [-1]
    return positions, ids, data_rows


def _rows(table: torch.Tensor, data_rows: list[int]) -> torch.Tensor:
    """Data rows of a step; padding rows get NaN garbage (their outputs must still be zeros)."""
    index = torch.tensor([max(r, 0) for r in data_rows])
    out = table[index].clone()
    out[torch.tensor(data_rows) < 0] = float("nan")
    return out


def _run_step(layer: Layer, graphs: tuple, data: dict, caches: dict, chunks: list) -> dict[str, torch.Tensor]:  # type: ignore[type-arg]
    positions, ids, data_rows = _step_rows(chunks)
    pos, seq_ids = i32(positions), i32(ids)
    per_seq = {"seq_slot": i32([SLOT[s] for s, _, _ in chunks]), "seq_start": i32([a for _, a, _ in chunks])}
    per_seq |= {"seq_end": i32([b for _, _, b in chunks]), "seq_window_start": i32([0] * len(chunks))}
    per_seq |= {"block_table": torch.tensor([TABLES[s] for s, _, _ in chunks], dtype=torch.int32)}
    weights = [data["wkv"]] + ([data["wgate"], caches["state"]] if layer.ratio == 2 else [])
    u = _rows(data["u"], data_rows)
    comp = run_graph(graphs[0], [u, *weights, pos, seq_ids, per_seq["seq_slot"], per_seq["seq_start"]])
    if layer.ratio == 2:
        caches["state"] = comp["state"]
    latent, kv_raw = comp["latent"], _rows(data["kv"], data_rows)
    x = {name: _rows(data[name], data_rows) for name in ("q", "qi", "wi")}
    x |= {"kv": fp8_g32_qdq(kv_raw), "kv_entries": CF.fp8_g32_encode(kv_raw)}
    x |= {
        "ckv_entries": CF.nvfp4_g16_encode(latent),
        "idx_entries": CF.mxfp4_g32_encode(latent[:, : layer.index_dim]),
    }
    x |= {"closes": comp["closes"], "entry_ids": pos // layer.ratio, "positions": pos, "seq_ids": seq_ids}
    x |= per_seq | {name: caches[name] for name in ("ring", "pool_kv", "pool_idx")}
    x |= {"sink": data["sink"], "neg_inf": torch.tensor(NEG_INF)}
    got = run_graph(graphs[1], {f"x.{name}": value for name, value in x.items()})
    caches.update({name: got[name] for name in ("ring", "pool_kv", "pool_idx")})
    got.update(latent=latent, closes=comp["closes"])
    return {"rows": data_rows, **got}


def _run_schedule(layer: Layer, data: dict, sizes: tuple[list[int], list[int]]) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """Process both sequences with per-sequence chunk sizes (step i takes sizes[s][i] rows of sequence s).

    Returns (per-row results keyed by (sequence, position), final caches)."""
    graphs = (_compress_graph(layer), _attend_graph(layer))
    d = layer.width
    caches = {
        "ring": torch.zeros(layer.slots, layer.ring_len, d + d // 32, dtype=torch.uint8),
        "pool_kv": torch.zeros(POOL_BLOCKS, layer.block_size, d // 2 + d // 16, dtype=torch.uint8),
        "pool_idx": torch.zeros(
            POOL_BLOCKS, layer.block_size, layer.index_dim // 2 + layer.index_dim // 32, dtype=torch.uint8
        ),
        "state": torch.zeros(layer.slots, layer.comp_ring, 2, d),
    }
    done, results = [0, 0], {}
    for step in range(max(len(sizes[0]), len(sizes[1]))):
        chunks = []
        for s in (0, 1) if step % 2 == 0 else (1, 0):  # alternate which sequence comes first
            if step < len(sizes[s]):
                chunks.append((s, done[s], done[s] + sizes[s][step]))
                done[s] += sizes[s][step]
        got = _run_step(layer, graphs, data, caches, chunks)
        for t, r in enumerate(got.pop("rows")):
            if r < 0:
                assert torch.equal(got["out"][t], torch.zeros_like(got["out"][t])), "padding row output"
                assert not got["closes"][t] and (got["scores"][t] == NEG_INF).all()
                continue
            s = 0 if r < LENGTHS[0] else 1
            key = (s, r - sum(LENGTHS[:s]))
            results[key] = {
                name: got[name][t] for name in ("out", "scores", "cand", "topk", "latent", "closes")
            }
    assert tuple(done) == LENGTHS
    return results, caches


def _chunks(length: int, first: int, rest: int) -> list[int]:
    sizes = [min(first, length)]
    while sum(sizes) < length:
        sizes.append(min(rest, length - sum(sizes)))
    return sizes


SCHEDULES = {
    "chunks_of_5": (_chunks(LENGTHS[0], 5, 5), _chunks(LENGTHS[1], 5, 5)),
    "chunks_of_17": (_chunks(LENGTHS[0], 17, 17), _chunks(LENGTHS[1], 17, 17)),
    "decode": (_chunks(LENGTHS[0], 1, 1), _chunks(LENGTHS[1], 1, 1)),
    "prefill_then_decode": (_chunks(LENGTHS[0], 17, 1), _chunks(LENGTHS[1], 5, 5)),
}
ONE_CHUNK = ([LENGTHS[0]], [LENGTHS[1]])

_ONE_CHUNK_CACHE: dict[int, tuple[dict, dict, dict]] = {}  # type: ignore[type-arg]


def _one_chunk(ratio: int) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    if ratio not in _ONE_CHUNK_CACHE:
        data = _make_data(Layer(ratio), seed=10 + ratio)
        _ONE_CHUNK_CACHE[ratio] = (data, *_run_schedule(Layer(ratio), data, ONE_CHUNK))
    return _ONE_CHUNK_CACHE[ratio]


@pytest.mark.parametrize("ratio", [1, 2])
def test_one_chunk_mini_layer_matches_hand_references(ratio: int) -> None:
    layer = Layer(ratio)
    data, results, _ = _one_chunk(ratio)
    for (s, p), got in results.items():
        r = _row_of(s, p)
        closes = p % ratio == ratio - 1
        assert bool(got["closes"]) == closes
        if closes and ratio == 1:
            torch.testing.assert_close(got["latent"], data["wkv"] @ data["u"][r], rtol=1e-5, atol=1e-5)
        elif closes:
            want = refs.pool_pairs(data["u"][r - 1 : r + 1], data["wkv"], data["wgate"])[0]
            torch.testing.assert_close(got["latent"], want, rtol=1e-5, atol=1e-5)
        visible = (p + 1) // ratio
        assert torch.isfinite(got["scores"][:visible]).all() and (got["scores"][visible:] == NEG_INF).all()
        masked = torch.where(got["cand"], got["scores"], NEG_INF).tolist()
        order = sorted((g for g in range(len(masked)) if masked[g] > NEG_INF), key=lambda g: (-masked[g], g))
        chosen = sorted(order[: layer.k])
        assert got["topk"].tolist() == chosen + [-1] * (layer.k - len(chosen))
        groups = {g: results[(s, g * ratio + ratio - 1)]["latent"] for g in chosen}
        swa = [fp8_g32_qdq(data["kv"][_row_of(s, x)]) for x in range(max(0, p - layer.window + 1), p + 1)]
        keys = torch.stack(swa + [nvfp4_g16_qdq(groups[g]) for g in chosen])
        want = refs.attend(data["q"][r], keys, data["sink"], layer.width**-0.5)
        torch.testing.assert_close(got["out"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("ratio", [1, 2])
def test_chunked_steps_equal_one_chunk_bit_for_bit(ratio: int, schedule: str) -> None:
    data, want, want_caches = _one_chunk(ratio)
    got, caches = _run_schedule(Layer(ratio), data, SCHEDULES[schedule])
    assert got.keys() == want.keys()
    for key, row in want.items():
        for name, value in row.items():
            assert torch.equal(got[key][name], value), f"{schedule}: {name} of (sequence, position) {key}"
    for name in ("ring", "pool_kv", "pool_idx"):
        assert torch.equal(caches[name], want_caches[name]), f"{schedule}: final {name}"
    # Both sequences are longer than the state ring, so every entry of their slots is the same position's.
    assert ratio == 1 or torch.equal(caches["state"], want_caches["state"]), f"{schedule}: final state"


@pytest.mark.parametrize("ratio", [1, 2])
def test_mini_layer_graphs_verify_and_round_trip(ratio: int) -> None:
    for graph in (_compress_graph(Layer(ratio)), _attend_graph(Layer(ratio))):
        verify(graph)
        assert deserialize(serialize(graph)) == graph
