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
from dsgraph.models.deepseek_v41.tiny import TINY_CONFIG  # noqa: E402
from dsgraph.ops import attention as A  # noqa: E402
from dsgraph.ops import cache as K  # noqa: E402
from dsgraph.ops import core as C  # noqa: E402
from dsgraph.platform.cpu import cache_format as CF  # noqa: E402
from dsgraph.platform.cpu.interpret import run_graph  # noqa: E402

T, S = "tokens", "seqs"
NEG_INF = float("-inf")
BACKEND = BackendConfig(
    attn="eager", linear="torch", rms_norm="torch_fp32", rope="torch", rope_fusion=False, experts="torch",
    dispatcher="torch", gate_precision="float32",
)
# A second size: wider heads, more index heads, a longer window and larger selections than the tiny config.
OTHER_SIZE = {
    "hidden_size": 128, "head_dim": 128, "qk_rope_head_dim": 32, "num_attention_heads": 2, "q_lora_rank": 64,
    "o_lora_rank": 32, "index_n_heads": 8, "index_head_dim": 64, "sliding_window": 16, "index_topk": 6,
    "candidate_block_size": 4, "candidate_topk_blocks": 3,
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


def _intermediates(layer: DeepseekV41Attention, h: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
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
        record = {"h": h, "state": state, "attended": attended[0], **_intermediates(layer, h, positions)}
        if layer.indexer is not None:
            record["scores"] = nemo_scores(record["iq"], state.index_keys, record["iw"], layer.compress_ratio)
            for captured in seen.scores:  # the candidate source's scores, as NeMo computed them
                assert torch.equal(captured, record["scores"]), f"hand copy of NeMo's scores, layer {layer.layer_idx}"
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
    """Encoded entries [2, W, bytes] -> (pool [blocks, BLOCK_SIZE, bytes], block_table [2, nb]): each sequence's
    blocks at shuffled physical ids, one more unallocated (-1) table column than needed."""
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
    out = [f"entry {g} (score {scores[g]}) above the k-th score {kth} not chosen" for g in sorted(must - set(chosen))]
    return out + [f"entry {g} chosen with score {scores[g]} != k-th {kth}" for g in chosen if g not in must and scores[g] != kth]
