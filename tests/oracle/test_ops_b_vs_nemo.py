"""Group B ops against NeMo AutoModel 0.7.0's V4.1 attention (CPU, FP32, eager backend).

NeMo computes whole sequences without caches. Its attention layers run with random weights on two
sequences at once; the inputs of our ops are taken from NeMo's own intermediate tensors (its projections,
RoPE and cache quantization), turned into cache bytes with our codecs, and our ops run one step holding
both sequences plus padding rows, or several steps (chunks of 5 rows, one row at a time) carrying the SWA
ring and the compressor state. Outputs must equal NeMo's to FP32 rounding; selections are compared
tie-aware (spec model-v41 11.4): everything strictly above the reference's k-th score is selected, and
the rest has exactly the k-th score.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("nemo_automodel")

import torch  # noqa: E402
from nemo_automodel.components.models.common import BackendConfig  # noqa: E402
from nemo_automodel.components.models.deepseek_v41 import attention as nemo_attention  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.attention import (  # noqa: E402
    DeepseekV41Attention,
    DeepseekV41AttentionState,
    _apply_rope,
)
from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41TextConfig  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.quantization import quantize_cache  # noqa: E402

from dsgraph.graph import TensorType, make_graph  # noqa: E402
from dsgraph.models.deepseek_v41.step_io import COMPRESSOR_RING  # noqa: E402
from dsgraph.models.deepseek_v41.tiny import TINY_CONFIG  # noqa: E402
from dsgraph.ops import attention as A  # noqa: E402
from dsgraph.ops import cache as K  # noqa: E402
from dsgraph.ops import core as C  # noqa: E402
from dsgraph.platform.cpu import cache_format as CF  # noqa: E402
from dsgraph.platform.cpu.interpret import run_graph  # noqa: E402
from tests.oracle.nemo_ref import CPU_BACKEND  # noqa: E402

T, S = "tokens", "seqs"
NEG_INF = float("-inf")
BACKEND = BackendConfig(**CPU_BACKEND)
# A second size: wider heads, more index heads, a longer window and larger selections than the tiny config.
OTHER_SIZE = {
    "hidden_size": 128,
    "head_dim": 128,
    "qk_rope_head_dim": 32,
    "num_attention_heads": 2,
    "q_lora_rank": 64,
    "o_lora_rank": 32,
    "index_n_heads": 8,
    "index_head_dim": 64,
    "sliding_window": 16,
    "index_topk": 6,
    "candidate_block_size": 4,
    "candidate_topk_blocks": 3,
}
SIZES = {"tiny": ({}, 24), "other": (OTHER_SIZE, 40)}  # config overrides, sequence length
BLOCK_SIZE = 4  # paged-cache block of our pools (independent of the candidate block size)


def tt(shape: tuple, dtype: str = "i32") -> TensorType:
    return TensorType(tuple(shape), dtype)


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# ------------------------------------------------------------------------------------------ NeMo side


def nemo_config(overrides: dict[str, Any]) -> DeepseekV41TextConfig:
    text = {**copy.deepcopy(TINY_CONFIG["text_config"]), **overrides, "dtype": "float32"}
    return DeepseekV41TextConfig(**text)


def nemo_layers(cfg: DeepseekV41TextConfig, seed: int) -> list[DeepseekV41Attention]:
    """Every backbone attention layer with random weights of unit-scale outputs (0.02 init gives all-zero
    FP4 keys)."""
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for i in range(cfg.num_hidden_layers):
        layer = DeepseekV41Attention(cfg, i, BACKEND)
        layer.reset_parameters()
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                w.data = torch.randn(w.shape, generator=gen) * w.shape[1] ** -0.5
        layer.attn_sink.data = torch.randn(cfg.num_attention_heads, generator=gen)
        layers.append(layer.eval())
    return layers


def _capture_attended(layer: DeepseekV41Attention, sink: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
    original = layer._project_output

    def spy(attended: torch.Tensor, angles: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        sink.append(attended.detach().clone())  # heads' outputs before inverse RoPE and wo_a/wo_b
        return original(attended, angles, valid)

    return spy


def _source_of(cfg: DeepseekV41TextConfig, i: int) -> int:
    """The KV source layer whose compressed cache layer i reads (the latest one of its ratio)."""
    ratio = cfg.compress_ratios[i]
    return max(j for j in cfg.kv_source_layer_ids if j <= i and cfg.compress_ratios[j] == ratio)


def _intermediates(
    layer: DeepseekV41Attention, h: torch.Tensor, positions: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The tensors NeMo's forward feeds into its attention, recomputed with the same submodules."""
    angles = layer.rotary_emb(positions)
    query_latent = layer.q_norm(layer.wq_a(h))
    out = {
        "q": _apply_rope(layer.wq_b(query_latent).unflatten(-1, (layer.num_heads, layer.head_dim)), angles),
        "kv_raw": _apply_rope(layer.kv_norm(layer.wkv(h)), angles),
    }
    ratio = layer.compress_ratio
    if ratio and layer.compressor is not None:
        width = h.shape[1] // ratio
        compressed_angles = layer.rotary_emb(positions[:, : width * ratio : ratio])
        latent = layer.compressor(h)
        out["comp_raw"] = _apply_rope(latent, compressed_angles)
        ix = layer.indexer
        out["key_raw"] = _apply_rope(ix.k_norm(ix.wk(latent)), compressed_angles)
    if layer.indexer is not None:
        ix = layer.indexer
        heads = ix.wq_b(query_latent).unflatten(-1, (ix.num_heads, ix.head_dim))
        out["iq"] = quantize_cache(_apply_rope(heads, angles), format="mxfp4", block_size=32)
        out["iw"] = ix.weights_proj(h) * (ix.head_dim**-0.5 * ix.num_heads**-0.5)
    return out


def nemo_scores(iq: torch.Tensor, keys: torch.Tensor, iw: torch.Tensor, ratio: int) -> torch.Tensor:
    """NeMo's indexer scores [2, L, width]. NeMo computes them inline in `_Indexer.forward` (eager branch);
    this repeats that code, and `run_nemo` checks it bit for bit against the scores NeMo hands to its
    candidate selection."""
    scores = torch.einsum("bshd,btd->bsht", iq, keys)
    scores = (scores.relu() * iw.unsqueeze(-1)).sum(dim=2)
    visible = (torch.arange(iq.shape[1]).unsqueeze(1) + 1) // ratio
    return scores.masked_fill(~(torch.arange(keys.shape[1]) < visible), NEG_INF)


_RUNS: dict[tuple[str, int], tuple[DeepseekV41TextConfig, list[dict[str, Any]]]] = {}


@torch.no_grad()
def run_nemo(size: str, seed: int = 0) -> tuple[DeepseekV41TextConfig, list[dict[str, Any]]]:
    """All six attention layers of the config on two random sequences; one record per layer."""
    if (size, seed) in _RUNS:
        return _RUNS[(size, seed)]
    overrides, length = SIZES[size]
    cfg = nemo_config(overrides)
    gen = torch.Generator().manual_seed(seed + 100)
    positions = torch.arange(length).unsqueeze(0)
    state, records = DeepseekV41AttentionState(), []
    for layer in nemo_layers(cfg, seed):
        h = torch.randn(2, length, cfg.hidden_size, generator=gen)
        attended: list[torch.Tensor] = []
        layer._project_output = _capture_attended(layer, attended)
        seen = _spy_candidate_scores()
        try:
            state = layer(h, position_ids=positions, state=state).state
        finally:
            nemo_attention._select_candidate_blocks = seen.original
        record = {"layer": layer, "h": h, "state": state, "attended": attended[0]}
        record.update(_intermediates(layer, h, positions))
        if layer.indexer is not None:
            record["scores"] = nemo_scores(record["iq"], state.index_keys, record["iw"], layer.compress_ratio)
            for captured in seen.scores:  # the candidate source's scores, as NeMo computed them
                assert torch.equal(captured, record["scores"]), (
                    f"hand copy of NeMo's scores, layer {layer.layer_idx}"
                )
        records.append(record)
    _RUNS[(size, seed)] = (cfg, records)
    return cfg, records


class _Spy:
    def __init__(self) -> None:
        self.original = nemo_attention._select_candidate_blocks
        self.scores: list[torch.Tensor] = []


def _spy_candidate_scores() -> _Spy:
    spy = _Spy()

    def select(scores: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        spy.scores.append(scores.clone())
        return spy.original(scores, *args, **kwargs)

    nemo_attention._select_candidate_blocks = select
    return spy


# ------------------------------------------------------------------------------------ our side: steps

SLOTS = (1, 0)  # state slot of sequence (batch row) 0 and 1
ONE_CHUNK, CHUNKS_OF_5, DECODE = "one_chunk", "chunks_of_5", "decode"


def schedule(length: int, kind: str) -> list[list[tuple[int, int, int]]]:
    """Steps of chunks (sequence, start, end): both sequences in every step, sequence 1 first on odd steps."""
    size = {ONE_CHUNK: length, CHUNKS_OF_5: 5, DECODE: 1}[kind]
    steps = []
    for n, start in enumerate(range(0, length, size)):
        end = min(start + size, length)
        steps.append([(b, start, end) for b in ((0, 1) if n % 2 == 0 else (1, 0))])
    return steps


def step_rows(chunks: list[tuple[int, int, int]]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """(positions, seq_ids, (sequence, position) per row or (-1, -1)) with a padding row after each chunk."""
    positions, ids, where = [], [], []
    for local, (b, start, end) in enumerate(chunks):
        positions += [*range(start, end), 0]
        ids += [local] * (end - start) + [-1]
        where += [(b, p) for p in range(start, end)] + [(-1, -1)]
    return i32(positions), i32(ids), where


def pick(x: torch.Tensor, where: list[tuple[int, int]]) -> torch.Tensor:
    """Rows x[b, p] of a NeMo tensor [2, L, ...]; padding rows are NaN (their outputs must be zeros)."""
    rows = torch.stack([x[max(b, 0), max(p, 0)] for b, p in where]).float()
    rows[torch.tensor([b < 0 for b, _ in where])] = float("nan")
    return rows


def paged(entries: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoded entries [2, W, bytes] -> (pool [blocks, BLOCK_SIZE, bytes], block_table [2, nb]): each
    sequence's blocks at shuffled physical ids, one more unallocated (-1) table column than needed."""
    width = entries.shape[1]
    used = -(-width // BLOCK_SIZE)
    physical = torch.randperm(2 * used, generator=torch.Generator().manual_seed(seed)).view(2, used)
    pool = torch.zeros(2 * used, BLOCK_SIZE, entries.shape[2], dtype=torch.uint8)
    for b in range(2):
        for g in range(width):
            pool[physical[b, g // BLOCK_SIZE], g % BLOCK_SIZE] = entries[b, g]
    table = torch.cat([physical, torch.full((2, 1), -1)], dim=1).to(torch.int32)
    return pool, table


def tie_aware_violations(chosen: list[int], scores: list[float], k: int) -> list[str]:
    """Why `chosen` is not a valid top-k of `scores` (finite entries only), or [] if it is."""
    finite = sorted((s for s in scores if s > NEG_INF), reverse=True)
    n = min(k, len(finite))
    if len(chosen) != n or len(set(chosen)) != n:
        return [f"chose {len(chosen)} distinct of {n}"]
    if n == 0:
        return []
    kth = finite[n - 1]
    must = {g for g, s in enumerate(scores) if s > kth}
    out = [
        f"entry {g} (score {scores[g]}) above the k-th score {kth} not chosen"
        for g in sorted(must - set(chosen))
    ]
    return out + [
        f"entry {g} chosen with score {scores[g]} != k-th {kth}"
        for g in chosen
        if g not in must and scores[g] != kth
    ]


# ------------------------------------------------------------------------------------------ compress


def run_compress(
    layer: DeepseekV41Attention, h: torch.Tensor, kind: str
) -> dict[tuple[int, int], torch.Tensor]:
    """Our compress over NeMo's hidden states in steps; returns the latent of every closed group (b, g)."""
    ratio, comp = layer.compress_ratio, layer.compressor
    width, hidden = comp.wkv.weight.shape
    types = [tt((T, hidden), "f32"), tt((width, hidden), "f32")]
    weights = [comp.wkv.weight.detach()]
    if ratio == 2:
        types += [tt((width, hidden), "f32"), tt((2, COMPRESSOR_RING, 2, width), "f32")]
        weights += [comp.wgate.weight.detach()]
    graph = make_graph(
        lambda *xs: K.compress(*xs, ratio=ratio), *types, tt((T,)), tt((T,)), tt((S,)), tt((S,))
    )
    state, latents = torch.zeros(2, COMPRESSOR_RING, 2, width), {}
    for chunks in schedule(h.shape[1], kind):
        positions, seq_ids, where = step_rows(chunks)
        slots, starts = i32([SLOTS[b] for b, _, _ in chunks]), i32([a for _, a, _ in chunks])
        args = [pick(h, where), *weights, *([state] if ratio == 2 else []), positions, seq_ids, slots, starts]
        outs = run_graph(graph, args)
        latent, closes = outs["0"], outs["1"]
        state = outs["2"] if ratio == 2 else state
        for t, (b, p) in enumerate(where):
            assert bool(closes[t]) == (b >= 0 and p % ratio == ratio - 1)
            if closes[t]:
                latents[(b, p // ratio)] = latent[t]
    return latents


@pytest.mark.parametrize("kind", [ONE_CHUNK, CHUNKS_OF_5, DECODE])
@pytest.mark.parametrize("size", sorted(SIZES))
def test_compress_matches_nemo_compressor(size: str, kind: str) -> None:
    cfg, records = run_nemo(size)
    for i in cfg.kv_source_layer_ids:
        layer, h = records[i]["layer"], records[i]["h"]
        bare = copy.deepcopy(layer.compressor)
        bare.norm = torch.nn.Identity()  # the op's latent is the pooled projection; the norm is a separate op
        with torch.no_grad():
            want = bare(h)
        got = run_compress(layer, h, kind)
        assert len(got) == 2 * want.shape[1]
        for (b, g), latent in got.items():
            torch.testing.assert_close(
                latent, want[b, g], rtol=1e-5, atol=1e-6, msg=lambda m, i=i: f"layer {i} {m}"
            )
        if kind != ONE_CHUNK:
            one = run_compress(layer, h, ONE_CHUNK)
            assert all(torch.equal(got[key], one[key]) for key in one), (
                f"layer {i}: {kind} differs from one chunk"
            )


# ------------------------------------------------------------------------- indexer, candidates, top-k


def run_selection(
    cfg: DeepseekV41TextConfig, records: list[dict[str, Any]], i: int
) -> dict[str, torch.Tensor]:
    """index_scores -> candidate_mask -> (mask with `allowed`) -> topk_select in one step holding both
    sequences and padding rows. For a Reindex layer `allowed` is NeMo's candidate mask of the source layer."""
    rec, source = records[i], records[_source_of(cfg, i)]
    keys = CF.mxfp4_g32_encode(source["key_raw"])
    assert torch.equal(CF.mxfp4_g32_decode(keys), source["state"].index_keys), "codec vs NeMo's index keys"
    pool, table = paged(keys, seed=i)
    length, width = rec["h"].shape[1], keys.shape[1]
    chunks = schedule(length, ONE_CHUNK)[0]
    positions, seq_ids, where = step_rows(chunks)
    table = table[[b for b, _, _ in chunks]]  # one block_table row per sequence of the step, in step order
    uses_candidates = 0 <= cfg.candidate_source_layer_id < i
    allowed = torch.ones(2, length, table.shape[1] * BLOCK_SIZE, dtype=torch.bool)
    if uses_candidates:
        allowed[:, :, :width] = rec["state"].candidates  # NeMo's, so both sides select from the same pool
    ix = rec["layer"].indexer

    def select(iq, iw, pool, table, positions, seq_ids, allowed, neg_inf):  # type: ignore[no-untyped-def]
        scores = A.index_scores(iq, iw, pool, table, positions, seq_ids, ratio=cfg.compress_ratios[i])
        cand = A.candidate_mask(
            scores, block_size=cfg.candidate_block_size, topk_blocks=cfg.candidate_topk_blocks
        )
        topk = A.topk_select(C.where(allowed, scores, neg_inf), k=cfg.index_topk)
        return {"scores": scores, "cand": cand, "topk": topk}

    types = [
        tt((T, ix.num_heads, ix.head_dim), "f32"),
        tt((T, ix.num_heads), "f32"),
        tt(tuple(pool.shape), "u8"),
    ]
    types += [tt((S, table.shape[1])), tt((T,)), tt((T,)), tt((T, allowed.shape[2]), "bool"), tt((), "f32")]
    rows_allowed = torch.stack([allowed[max(b, 0), p] for b, p in where])
    args = [pick(rec["iq"], where), pick(rec["iw"], where), pool, table, positions, seq_ids, rows_allowed]
    out = run_graph(make_graph(select, *types), [*args, torch.tensor(NEG_INF)])
    return {"where": where, "width": width, **out}


@pytest.mark.parametrize("size", sorted(SIZES))
def test_indexer_scores_candidates_and_topk_match_nemo(size: str) -> None:
    cfg, records = run_nemo(size)
    for i in cfg.index_source_layer_ids:
        got, rec = run_selection(cfg, records, i), records[i]
        width, ref = got["width"], rec["scores"]
        nemo_topk, nemo_cand = rec["state"].topk_indices, rec["state"].candidates
        for t, (b, p) in enumerate(got["where"]):
            if b < 0:
                assert (got["scores"][t] == NEG_INF).all() and (got["topk"][t] == -1).all()
                continue
            scores = got["scores"][t]
            assert (scores[width:] == NEG_INF).all(), "entries past the sequence's groups are invisible"
            torch.testing.assert_close(scores[:width], ref[b, p], rtol=1e-5, atol=1e-6)
            masked = ref[b, p]
            if 0 <= cfg.candidate_source_layer_id < i:
                masked = masked.masked_fill(~rec["state"].candidates[b, p], NEG_INF)
            ours = [g for g in got["topk"][t].tolist() if g >= 0]
            theirs = [g for g in nemo_topk[b, p].tolist() if g >= 0]
            assert not tie_aware_violations(theirs, masked.tolist(), cfg.index_topk), "NeMo itself"
            assert not tie_aware_violations(ours, masked.tolist(), cfg.index_topk), (i, b, p, ours, theirs)
            if i == cfg.candidate_source_layer_id:
                _check_candidates(got["cand"][t, :width], nemo_cand[b, p], ref[b, p], cfg)


def _check_candidates(
    ours: torch.Tensor, theirs: torch.Tensor, scores: torch.Tensor, cfg: DeepseekV41TextConfig
) -> None:
    """Same candidate pool as NeMo, up to ties between block scores at the cut-off."""
    if torch.equal(ours, theirs):
        return
    bs, width = cfg.candidate_block_size, scores.shape[0]
    blocks = torch.nn.functional.pad(scores, (0, -width % bs), value=NEG_INF).view(-1, bs).amax(-1)
    newest = int(torch.isfinite(scores).nonzero().max())
    blocks[newest // bs] = float("inf")
    kept = lambda mask: {int(g) // bs for g in mask.nonzero().flatten()}  # noqa: E731
    assert not tie_aware_violations(sorted(kept(ours)), blocks.tolist(), cfg.candidate_topk_blocks)
    assert not tie_aware_violations(sorted(kept(theirs)), blocks.tolist(), cfg.candidate_topk_blocks)
    visible = torch.isfinite(scores)
    for mask in (ours, theirs):
        assert torch.equal(mask, visible & torch.tensor([g // bs in kept(mask) for g in range(width)]))


# ------------------------------------------------------------------------------------------- attention


def _attention_inputs(cfg: DeepseekV41TextConfig, records: list[dict[str, Any]], i: int) -> dict[str, Any]:
    """SWA ring (empty), and for compressed layers the source's NVFP4 pool and this layer's NeMo top-k."""
    rec, window = records[i], cfg.sliding_window
    kv_q = quantize_cache(rec["kv_raw"], format="fp8", block_size=32)
    assert torch.equal(CF.fp8_g32_decode(CF.fp8_g32_encode(rec["kv_raw"])), kv_q), "codec vs NeMo's SWA keys"
    ring = torch.zeros(2, window + 6, cfg.head_dim + cfg.head_dim // 32, dtype=torch.uint8)
    out: dict[str, Any] = {"kv_q": kv_q, "ring": ring, "extra": None}
    if cfg.compress_ratios[i]:
        source = records[_source_of(cfg, i)]
        entries = CF.nvfp4_g16_encode(source["comp_raw"])
        assert torch.equal(CF.nvfp4_g16_decode(entries), source["state"].compressed_kv), "codec vs NeMo's KV"
        out["extra"] = (*paged(entries, seed=10 + i), rec["state"].topk_indices)
    return out


def run_attention(cfg: DeepseekV41TextConfig, records: list[dict[str, Any]], i: int, kind: str) -> dict:  # type: ignore[type-arg]
    """Our attention (+ swa_write carrying the ring) over NeMo's q/kv; out rows keyed by (b, p)."""
    rec, inputs = records[i], _attention_inputs(cfg, records, i)
    nh, hd = cfg.num_attention_heads, cfg.head_dim
    ring, extra = inputs["ring"], inputs["extra"]

    def step(q, kv, ring, sink, positions, seq_ids, seq_slot, seq_start, first, seq_end, kv_entries, *extra):  # type: ignore[no-untyped-def]
        out = A.attention(
            q,
            kv,
            ring,
            sink,
            positions,
            seq_ids,
            seq_slot,
            seq_start,
            first,
            *extra,
            window=cfg.sliding_window,
            softmax_scale=hd**-0.5,
        )
        return {"out": out, "ring": K.swa_write(ring, kv_entries, positions, seq_ids, seq_slot, seq_end)}

    types = [tt((T, nh, hd), "f32"), tt((T, hd), "f32"), tt(tuple(ring.shape), "u8"), tt((nh,), "f32")]
    types += [tt((T,)), tt((T,)), tt((S,)), tt((S,)), tt((S,)), tt((S,)), tt((T, ring.shape[2]), "u8")]
    if extra is not None:
        types += [tt(tuple(extra[0].shape), "u8"), tt((S, extra[1].shape[1])), tt((T, extra[2].shape[2]))]
    graph, outputs = make_graph(step, *types), {}
    for chunks in schedule(rec["h"].shape[1], kind):
        positions, seq_ids, where = step_rows(chunks)
        per_seq = [
            i32([SLOTS[b] for b, _, _ in chunks]),
            i32([a for _, a, _ in chunks]),
            i32([0] * len(chunks)),  # every sequence holds its SWA keys from position 0
            i32([e for _, _, e in chunks]),
        ]
        args = [pick(rec["q"], where), pick(inputs["kv_q"], where), ring, rec["layer"].attn_sink.detach()]
        args += [positions, seq_ids, *per_seq, CF.fp8_g32_encode(pick(rec["kv_raw"], where))]
        if extra is not None:
            garbage = torch.full(
                (extra[2].shape[2],), 10**6, dtype=torch.int64
            )  # padding rows' top-k is ignored
            topk = torch.stack([extra[2][b, p] if b >= 0 else garbage for b, p in where]).to(torch.int32)
            args += [extra[0], extra[1][[b for b, _, _ in chunks]], topk]  # block_table rows follow the step
        got = run_graph(graph, args)
        ring = got["ring"]
        for t, key in enumerate(where):
            outputs[key] = got["out"][t]
    return outputs


_ONE_CHUNK_OUT: dict[tuple[str, int], dict] = {}  # type: ignore[type-arg]


def _one_chunk_attention(size: str, i: int) -> dict:  # type: ignore[type-arg]
    if (size, i) not in _ONE_CHUNK_OUT:
        cfg, records = run_nemo(size)
        _ONE_CHUNK_OUT[(size, i)] = run_attention(cfg, records, i, ONE_CHUNK)
    return _ONE_CHUNK_OUT[(size, i)]


@pytest.mark.parametrize("kind", [ONE_CHUNK, CHUNKS_OF_5, DECODE])
@pytest.mark.parametrize("size", sorted(SIZES))
def test_attention_matches_nemo_for_every_layer_mode(size: str, kind: str) -> None:
    cfg, records = run_nemo(size)
    for i in range(cfg.num_hidden_layers):  # SWA, Full r2, Reuse r2, Full r1, Reindex r1, Reuse r1
        got = run_attention(cfg, records, i, kind)
        assert torch.equal(got.pop((-1, -1)), torch.zeros(cfg.num_attention_heads, cfg.head_dim))
        want = records[i]["attended"]
        assert len(got) == want.shape[0] * want.shape[1]
        for (b, p), out in got.items():
            torch.testing.assert_close(
                out, want[b, p], rtol=1e-5, atol=1e-6, msg=lambda m, i=i, b=b, p=p: f"layer {i} ({b},{p}) {m}"
            )
        if kind != ONE_CHUNK:
            one = _one_chunk_attention(size, i)
            assert all(torch.equal(got[k], one[k]) for k in got), f"layer {i}: {kind} differs from one chunk"
