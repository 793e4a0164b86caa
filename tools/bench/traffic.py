"""Bytes a decode step must read from HBM at the least (the roofline numerator): every dense weight
once, the routed experts the batch is expected to touch, the gathered embedding and Engram rows, and per
request its SWA window, its selected compressed entries and the index keys its indexers must score."""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor

from dsgraph.models.deepseek_v41.layers_plan import LayerMode
from dsgraph.models.deepseek_v41.model import V41Model
from dsgraph.platform.cpu.cache_format import (
    fp8_g32_entry_bytes,
    mxfp4_g32_entry_bytes,
    nvfp4_g16_entry_bytes,
)

_ROUTED = re.compile(r"layers\.\d+\.ffn\.experts\.w[123]\.(weight|scale)")
_ENGRAM_ROWS = re.compile(r"layers\.\d+\.engram\.embed\.(weight|scale)")


def distinct_experts(experts: int, topk: int, tokens: int) -> float:
    """Expected experts hit by `tokens` tokens each routed to `topk` of `experts` uniformly."""
    return experts * (1.0 - (1.0 - topk / experts) ** tokens)


def weight_bytes(model: V41Model, weights: Mapping[str, Tensor], tokens: int) -> float:
    t = model.cfg.text
    hit = distinct_experts(t.n_routed_experts, t.num_experts_per_tok, tokens) / t.n_routed_experts
    rows_per_token = (t.engram_max_ngram_size - 1) * t.engram_n_heads
    total = 0.0
    for name, w in weights.items():
        if name.startswith("mtp."):  # the drafter's weights: not read by a target decode step
            continue
        nbytes = w.numel() * w.element_size()
        if _ROUTED.fullmatch(name):
            total += nbytes * hit
        elif name == "embed.weight":
            total += tokens * nbytes / w.shape[0]
        elif _ENGRAM_ROWS.fullmatch(name):
            total += tokens * rows_per_token * nbytes / w.shape[0]
        else:
            total += nbytes
    return total


def kv_bytes_per_request(model: V41Model, context: int) -> float:
    t = model.cfg.text
    swa = min(context, t.sliding_window) * fp8_g32_entry_bytes(t.head_dim)
    total = 0.0
    for p in model.plans:
        total += swa
        if p.ratio == 0:
            continue
        entries = context // p.ratio
        total += min(entries, t.index_topk) * nvfp4_g16_entry_bytes(t.head_dim)
        if p.mode is LayerMode.FULL:
            total += entries * mxfp4_g32_entry_bytes(t.index_head_dim)
        elif p.mode is LayerMode.REINDEX:  # scores only the candidate blocks' entries
            candidates = t.candidate_topk_blocks * t.candidate_block_size
            total += min(entries, candidates) * mxfp4_g32_entry_bytes(t.index_head_dim)
    return total


def decode_bytes(model: V41Model, weights: Mapping[str, Tensor], batch: int, context: int) -> float:
    return weight_bytes(model, weights, batch) + batch * kv_bytes_per_request(model, context)


def active_weight_elements(model: V41Model) -> float:
    """Weight-matrix elements one token multiplies through: every 2-D matrix of the backbone and head
    (routed experts: top-k of them; embeddings and Engram tables are gathers, not GEMMs). Prefill's
    GEMM FLOPs are 2 x tokens x this."""
    from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, expected_tensors

    t = model.cfg.text
    routed = t.num_experts_per_tok / t.n_routed_experts
    total = 0.0
    for name, spec in expected_tensors(model.cfg).items():
        shape = spec.logical_shape
        if spec.kind is TensorKind.SCALE or name.startswith("mtp.") or len(shape) != 2:
            continue
        if name == "embed.weight" or ".engram.embed." in name:
            continue
        elements = float(shape[0] * shape[1])
        total += elements * (routed if ".ffn.experts." in name else 1.0)
    return total
