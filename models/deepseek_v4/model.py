"""A V4 model ready to trace: config, layer plans, numerics and cache geometry; the step graph.

The step's inputs are the V4.1 step layout (models/deepseek_v41/step_io.py; V4 ignores `lookback`), so
the runtime drives both models the same way. Caches: per layer `swa.{i}`; per compressed layer `ckv.{i}`
pages and `comp.{i}` compressor state; per CSA layer also `kidx.{i}` pages and `icomp.{i}` (the indexer's
compressor state). Every cache holds f32 values (`attention_block.CACHE_FMT`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.models.deepseek_v4 import mtp_draft
from dsgraph.models.deepseek_v4.attention_block import CACHE_FMT, attention
from dsgraph.models.deepseek_v4.config import V4Config
from dsgraph.models.deepseek_v4.layers import Attn, LayerPlan, layer_plans
from dsgraph.models.deepseek_v41.backbone import _hc, embed, head
from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.dspark import DRAFT_STREAM
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest
from dsgraph.models.deepseek_v41.ffn_block import moe
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.models.deepseek_v41.step_io import ROLLBACK_ROOM, CacheGeometry, step_types
from dsgraph.ops import op
from dsgraph.ops.quant import entry_bytes
from dsgraph.ops.window_compress import window_span

__all__ = ["V4Model", "build_model", "trace_step"]


@dataclass(frozen=True)
class V4Model:
    cfg: V4Config
    plans: tuple[LayerPlan, ...]
    num: Numerics
    geo: CacheGeometry
    # built to draft with the MTP layer (models/deepseek_v4/mtp_draft.py): the step also writes the MTP
    # rings and reads the layer's context weights (the field name is the runtime's Model protocol's)
    dspark: bool = False
    expert_parallel: bool = False
    truncation: str = "off"  # V4 has no prefill truncation (models/registry.py refuses it)

    def step_types(self, truncated: bool = False) -> dict[str, TensorType]:
        _no_truncation(truncated)
        return step_types(self.cfg.text, self.plans, self.geo)  # type: ignore[arg-type]

    def cache_types(self) -> dict[str, TensorType]:
        t, g = self.cfg.text, self.geo
        types: dict[str, TensorType] = {}
        for p in self.plans:
            types[f"swa.{p.index}"] = TensorType(
                ("slots", g.ring_len, entry_bytes(CACHE_FMT, t.head_dim)), "u8"
            )
            if p.attn is Attn.SWA:
                continue
            caches = [("ckv", "comp", t.head_dim)]
            if p.attn is Attn.CSA:
                caches.append(("kidx", "icomp", t.index_head_dim))
            ring = window_span(p.ratio, p.overlap) + ROLLBACK_ROOM - 1
            for pool, state, width in caches:
                entry = entry_bytes(CACHE_FMT, width)
                types[f"{pool}.{p.index}"] = TensorType((f"blocks{p.ratio}", g.page_size, entry), "u8")
                series = 2 * width if p.overlap else width
                types[f"{state}.{p.index}"] = TensorType(("slots", ring, 2, series), "f32")
        return types | (mtp_draft.mtp_ring_types(self) if self.dspark else {})

    def trace_step(
        self,
        weights: Mapping[str, TensorType],
        *,
        name: str = "v4_step",
        debug: bool = False,
        truncated: bool = False,
    ) -> Graph:
        _no_truncation(truncated)
        return trace_step(self, weights, name=name, debug=debug)

    # the runtime's Drafter protocol (models/interface.py), for a model built with dspark=True
    num_draft_tokens = 1  # one MTP layer drafts one token per pass

    def is_draft_weight(self, name: str) -> bool:
        return mtp_draft.is_draft_weight(name)

    def is_context_weight(self, name: str) -> bool:
        return mtp_draft.is_context_weight(name)

    def trace_draft(
        self, weights: Mapping[str, TensorType], *, stream: int = DRAFT_STREAM, greedy: bool = False
    ) -> Graph:
        return mtp_draft.trace_draft(self, weights, stream=stream, greedy=greedy)

    def draft_inputs(self, requests: Sequence[DraftRequest], num_seqs: int) -> dict[str, Any]:
        return mtp_draft.draft_inputs(requests, num_seqs)


def _no_truncation(truncated: bool) -> None:
    if truncated:
        raise ValueError("prefill_truncation: deepseek_v4 has no truncated prefill step (allowed: 'off')")


def build_model(cfg: V4Config, num: Numerics, geo: CacheGeometry, *, dspark: bool = False) -> V4Model:
    """`dspark`: build to draft with the config's MTP layer (needs num_nextn_predict_layers == 1)."""
    if dspark and cfg.text.num_nextn_predict_layers != 1:
        raise ValueError(
            f"build_model: drafting needs num_nextn_predict_layers 1 (one MTP layer), the config has "
            f"{cfg.text.num_nextn_predict_layers}"
        )
    return V4Model(cfg, layer_plans(cfg.text), num, geo, dspark=dspark)


def _hc_head(f: Forward, x: Tracer) -> Tracer:
    """The final collapse's stream weights [T, n] f32: sigmoid(scale * (fn . v) / rms(v) + base) + hc_eps."""
    t = f.text
    flat = op.reshape(f.cast(x, "f32"), shape=("tokens", t.hc_mult * t.hidden_size))
    rms = op.rsqrt(op.reduce_mean(flat * flat, axes=(-1,), keepdims=True) + float(t.rms_norm_eps))
    mix = op.linear(flat, f.w("hc_head_fn"), out_dtype="f32") * rms
    return op.sigmoid(mix * f.w("hc_head_scale") + f.w("hc_head_base")) + float(t.hc_eps)


def _block(f: Forward, plan: LayerPlan, x: Tracer, entries: int) -> Tracer:
    """Each sublayer's mHC coefficients come from its own input streams and are used at once."""
    p = f"layers.{plan.index}."
    pre, post, comb = _hc(f, x, p + "hc_attn")
    u = f.norm(op.hc_collapse(x, pre, out_dtype=f.num.act_dtype), p + "attn_norm.weight")
    x = op.hc_expand(attention(f, plan, u, entries), x, post, comb)
    pre, post, comb = _hc(f, x, p + "hc_ffn")
    u = f.norm(op.hc_collapse(x, pre, out_dtype=f.num.act_dtype), p + "ffn_norm.weight")
    bias = op.gather_rows(f.w(p + "ffn.gate.hash_bias"), f.step["token_ids"]) if plan.is_hash else None
    return op.hc_expand(moe(f, plan.index, u, bias=bias), x, post, comb)


def _forward(f: Forward, model: V4Model) -> dict[str, Any]:
    x = embed(f)
    for plan in model.plans:
        entries = model.geo.pages_per_seq(plan.ratio) * model.geo.page_size if plan.ratio else 0
        x = _block(f, plan, x, entries)
    pre = _hc_head(f, x)
    out: dict[str, Any] = {"logits": head(f, x, pre)}
    if model.dspark:
        mtp_draft.write_context(f, op.hc_collapse(x, pre, out_dtype=f.num.act_dtype))
    out["caches"] = dict(f.new_caches)
    if f.debug is not None:
        out["debug"] = dict(f.debug)
    return out


def trace_step(
    model: V4Model, weights: Mapping[str, TensorType], *, name: str = "v4_step", debug: bool = False
) -> Graph:
    """The step graph: inputs `weights.*`, `caches.*`, `step.*`; outputs `logits` and `caches.*`."""

    def step(weights: dict[str, Any], caches: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        f = Forward(
            model.cfg.text,  # type: ignore[arg-type]  (the fields Forward reads have V4 equivalents)
            model.num,
            weights,
            step,
            caches,
            debug={} if debug else None,
            expert_parallel=model.expert_parallel,
        )
        return _forward(f, model)

    return make_graph(step, dict(weights), model.cache_types(), model.step_types(), name=name)
