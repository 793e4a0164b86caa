"""Graph inputs of one step: step metadata and caches (weights come from `weights.py`).

Symbolic dims: `tokens` (rows of the flat batch), `seqs` (sequences), `outs` (rows whose logits are
wanted), `slots` (request state slots: SWA rings, compressor state), `blocks1`/`blocks2` (pages of the
ratio-1/ratio-2 compressed caches). The block-table width (max pages per sequence) is concrete: it is
fixed by max_model_len.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsgraph.graph.types import TensorType
from dsgraph.models.deepseek_v41.config import TextConfig
from dsgraph.models.deepseek_v41.layers_plan import LayerMode, LayerPlan
from dsgraph.platform.cpu.cache_format import (
    fp8_g32_entry_bytes,
    mxfp4_g32_entry_bytes,
    nvfp4_g16_entry_bytes,
)

ROLLBACK_ROOM = 6  # anchor + 5 drafts may be written and rolled back (spec 5.6)
# Ratio-2 compressor state: a ring of the newest positions' projections, ratio + ROLLBACK_ROOM - 1 entries
# (DeepInfer's size), so the rows a verify step rolls back never overwrite the open group's first token.
COMPRESSOR_RING = 2 + ROLLBACK_ROOM - 1


@dataclass(frozen=True, slots=True)
class CacheGeometry:
    ring_len: int  # SWA ring entries per request and layer (>= window + ROLLBACK_ROOM)
    page_size: int  # compressed entries per page
    max_model_len: int

    def pages_per_seq(self, ratio: int) -> int:
        entries = -(-self.max_model_len // ratio)
        return -(-entries // self.page_size)


def default_geometry(
    text: TextConfig, max_model_len: int | None = None, page_size: int = 64
) -> CacheGeometry:
    return CacheGeometry(
        text.sliding_window + ROLLBACK_ROOM, page_size, max_model_len or text.max_position_embeddings
    )


def ratios(plans: tuple[LayerPlan, ...]) -> tuple[int, ...]:
    return tuple(sorted({p.ratio for p in plans if p.ratio > 0}))


def step_types(text: TextConfig, plans: tuple[LayerPlan, ...], geo: CacheGeometry) -> dict[str, TensorType]:
    i32 = "i32"
    types = {
        "token_ids": TensorType(("tokens",), i32),
        "positions": TensorType(("tokens",), i32),
        "seq_ids": TensorType(("tokens",), i32),
        "seq_slot": TensorType(("seqs",), i32),
        "seq_start": TensorType(("seqs",), i32),
        "seq_end": TensorType(("seqs",), i32),
        # first position whose SWA key the sequence holds (its replay start after a prefix-cache hit)
        "seq_window_start": TensorType(("seqs",), i32),
        "lookback": TensorType(("seqs", text.engram_max_ngram_size - 1), i32),
        "sample_rows": TensorType(("outs",), i32),
        "is_replay": TensorType(("tokens",), i32),  # 1: a row recomputed after a prefix-cache hit
    }
    for r in ratios(plans):
        types[f"block_table_r{r}"] = TensorType(("seqs", geo.pages_per_seq(r)), i32)
    return types


def cache_types(text: TextConfig, plans: tuple[LayerPlan, ...], geo: CacheGeometry) -> dict[str, TensorType]:
    """Per layer the `swa.{i}` ring; per KV source `ckv.{i}`, `kidx.{i}` pages and (ratio 2) `comp.{i}`."""
    hd = text.head_dim
    types: dict[str, TensorType] = {}
    for p in plans:
        types[f"swa.{p.index}"] = TensorType(("slots", geo.ring_len, fp8_g32_entry_bytes(hd)), "u8")
        if p.mode is LayerMode.FULL:
            blocks = f"blocks{p.ratio}"
            types[f"ckv.{p.index}"] = TensorType((blocks, geo.page_size, nvfp4_g16_entry_bytes(hd)), "u8")
            kidx_bytes = mxfp4_g32_entry_bytes(text.index_head_dim)
            types[f"kidx.{p.index}"] = TensorType((blocks, geo.page_size, kidx_bytes), "u8")
            if p.ratio == 2:
                types[f"comp.{p.index}"] = TensorType(("slots", COMPRESSOR_RING, 2, hd), "f32")
    return types


def global_bytes_per_token(plans: tuple[LayerPlan, ...], head_dim: int, index_head_dim: int) -> float:
    """Bytes of global (compressed) cache per token: per KV-source layer of ratio r, one NVFP4-g16 entry
    of the head and one MXFP4-g32 entry of the index key every r tokens."""
    entry = nvfp4_g16_entry_bytes(head_dim) + mxfp4_g32_entry_bytes(index_head_dim)
    return math.fsum(entry / p.ratio for p in plans if p.mode is LayerMode.FULL)
