"""Per-layer roles derived from the config lists (spec model-v41 section 2): never hard-coded.

SWA: window only. FULL: a KV source (owns compressor + indexer keys, computes its own top-k).
REINDEX: reads its KV source's entries and keys, computes a fresh top-k. REUSE: reads the latest KV
source's entries and the latest top-k unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dsgraph.models.deepseek_v41.config import TextConfig

__all__ = ["LayerMode", "LayerPlan", "draft_plans", "layer_plans", "plans_as_text"]


class LayerMode(enum.Enum):
    SWA = "swa"
    FULL = "full"
    REINDEX = "reindex"
    REUSE = "reuse"


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """The role of one layer. Layer ids are backbone indices; DSpark stage k has index L + k."""

    index: int
    ratio: int
    mode: LayerMode
    kv_source: int  # layer whose compressed cache it reads; -1 for SWA
    topk_source: int  # layer whose selection it uses; -1 for SWA
    is_candidate_source: bool
    uses_candidates: bool
    engram_table: int  # index into engram_layer_ids, or -1
    rope_theta: float
    use_yarn: bool
    is_draft_stage: bool = False

    def as_text(self) -> str:
        """One stable line, e.g. `layer 20 r=1 full kv=20 topk=20 cand=src engram=- rope=160000+yarn`."""
        cand = "src" if self.is_candidate_source else ("use" if self.uses_candidates else "-")
        engram = str(self.engram_table) if self.engram_table >= 0 else "-"
        rope = f"{self.rope_theta:g}" + ("+yarn" if self.use_yarn else "")
        kind = "stage" if self.is_draft_stage else "layer"
        return (
            f"{kind} {self.index} r={self.ratio} {self.mode.value} kv={self.kv_source} "
            f"topk={self.topk_source} cand={cand} engram={engram} rope={rope}"
        )


def layer_plans(text: TextConfig) -> tuple[LayerPlan, ...]:
    """Roles of the backbone layers 0..num_hidden_layers-1 (the config is already validated)."""
    plans: list[LayerPlan] = []
    kv_source, topk_source = -1, -1
    cand = text.candidate_source_layer_id
    for i in range(text.num_hidden_layers):
        ratio = text.compress_ratios[i]
        if ratio == 0:
            plans.append(_swa_plan(text, i))
            continue
        if i in text.kv_source_layer_ids:
            mode, kv_source, topk_source = LayerMode.FULL, i, i
        elif i in text.index_source_layer_ids:
            mode, topk_source = LayerMode.REINDEX, i
        else:
            mode = LayerMode.REUSE
        plans.append(
            LayerPlan(
                index=i,
                ratio=ratio,
                mode=mode,
                kv_source=kv_source,
                topk_source=topk_source,
                is_candidate_source=i == cand,
                uses_candidates=mode is LayerMode.REINDEX and 0 <= cand < i,
                engram_table=_engram_table(text, i),
                rope_theta=text.compress_rope_theta,
                use_yarn=True,
            )
        )
    return tuple(plans)


def draft_plans(text: TextConfig) -> tuple[LayerPlan, ...]:
    """Roles of the DSpark stages: SWA-only, base RoPE, no Engram."""
    first = text.num_hidden_layers
    return tuple(_swa_plan(text, first + k, is_draft=True) for k in range(text.num_nextn_predict_layers))


def plans_as_text(plans: tuple[LayerPlan, ...]) -> str:
    """The plan table, one line per layer, for dumps and golden tests."""
    return "\n".join(p.as_text() for p in plans) + "\n"


def _swa_plan(text: TextConfig, i: int, is_draft: bool = False) -> LayerPlan:
    return LayerPlan(
        index=i,
        ratio=0,
        mode=LayerMode.SWA,
        kv_source=-1,
        topk_source=-1,
        is_candidate_source=False,
        uses_candidates=False,
        engram_table=-1 if is_draft else _engram_table(text, i),
        rope_theta=text.rope_theta,
        use_yarn=False,
        is_draft_stage=is_draft,
    )


def _engram_table(text: TextConfig, i: int) -> int:
    ids = text.engram_layer_ids
    return ids.index(i) if i in ids else -1
