"""Per-layer roles of a V4 backbone, derived from the config: attention kind and RoPE, MoE routing."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dsgraph.models.deepseek_v4.config import V4TextConfig

__all__ = ["Attn", "LayerPlan", "layer_plans"]


class Attn(enum.Enum):
    SWA = "sliding_attention"  # ratio 0: the sliding window only
    CSA = "compressed_sparse_attention"  # ratio 4, overlapping windows, an indexer selects top-k entries
    HCA = "heavily_compressed_attention"  # ratio 128, every visible compressed entry is attended


@dataclass(frozen=True, slots=True)
class LayerPlan:
    index: int
    ratio: int
    attn: Attn
    rope_theta: float
    use_yarn: bool  # compressed layers use compress_rope_theta with the config's YaRN scaling
    is_hash: bool  # experts chosen by the token id (`ffn.gate.tid2eid`), not by the router's top-k

    @property
    def overlap(self) -> bool:
        return self.attn is Attn.CSA


def layer_plans(t: V4TextConfig) -> tuple[LayerPlan, ...]:
    kinds = {0: Attn.SWA, t.csa_ratio: Attn.CSA, t.hca_ratio: Attn.HCA}
    return tuple(
        LayerPlan(
            i,
            r,
            kinds[r],
            float(t.rope_theta if r == 0 else t.compress_rope_theta),
            r > 0 and t.rope_scaling is not None,
            i < t.num_hash_layers,
        )
        for i, r in enumerate(t.compress_ratios)
    )
