"""The MTP draft layer of a V4 checkpoint (`num_nextn_predict_layers` >= 1) as a traced graph.

transformers' DeepseekV4ForCausalLM does not implement the MTP layer (it ignores `mtp.*`), so this follows
DeepSeek-V3's MTP design, carried over to V4's blocks. At row j (token t_j at position p_j) with the
target's final hidden state h_j (the input of the final `norm`: the streams collapsed by `hc_head`):

    x = eh_proj([hnorm(h_j); enorm(embed(t_j))])          # [T, H], eh_proj [H, 2H]
    streams = x copied into hc_mult residual streams        # as the backbone's embedding
    streams = one V4 sliding-window decoder block (mHC, attention with sinks, MoE), its own `swa` ring
    logits = head(norm(collapse by its own hc_head))        # `mtp.0.norm`, `mtp.0.hc_head_*`; shared head

so with rows pairing h_{i} with t_{i+1} the logits at row i+1 predict t_{i+2}. Tensor names: `mtp.0.` +
`enorm.weight`, `hnorm.weight`, `eh_proj.weight`, `norm.weight`, `hc_head_{fn,base,scale}`, and the
block's tensors under the backbone layer's names (`attn_norm`, `attn.*`, `ffn_norm`, `ffn.*`,
`hc_attn_*`, `hc_ffn_*`). These names are this module's; they are not checked against a released V4
checkpoint's MTP tensors, so the loader keeps skipping `mtp.*` of real checkpoints. Inside the graph the
block runs as backbone layer L = num_hidden_layers (its weights aliased to `layers.L.*`, its ring
`swa.L`), reusing the backbone's block code unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.models.deepseek_v4.attention_block import CACHE_FMT
from dsgraph.models.deepseek_v4.config import V4TextConfig
from dsgraph.models.deepseek_v4.layers import Attn, LayerPlan
from dsgraph.models.deepseek_v41.backbone import head
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, TensorSpec, _Builder
from dsgraph.models.deepseek_v41.context import Forward
from dsgraph.ops import op
from dsgraph.ops.quant import entry_bytes

__all__ = [
    "MTP_PREFIX",
    "aliased",
    "mtp_cache_types",
    "mtp_plan",
    "mtp_step_types",
    "mtp_streams",
    "mtp_tensors",
    "trace_mtp",
]

MTP_PREFIX = "mtp.0."
_LEAVES = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "norm.weight")
_HEAD = ("hc_head_fn", "hc_head_base", "hc_head_scale")


def mtp_plan(t: V4TextConfig) -> LayerPlan:
    """The MTP block's plan: a sliding-window layer with the backbone's RoPE, routed by its router."""
    return LayerPlan(t.num_hidden_layers, 0, Attn.SWA, float(t.rope_theta), False, False)


def mtp_tensors(cfg: Any) -> dict[str, TensorSpec]:
    """The MTP layer's checkpoint tensors (empty when the config declares none)."""
    from dsgraph.models.deepseek_v4.checkpoint_spec import _layer

    t = cfg.text
    if t.num_nextn_predict_layers < 1:
        return {}
    if t.num_nextn_predict_layers > 1:
        raise ValueError(
            f"num_nextn_predict_layers: {t.num_nextn_predict_layers}, only 1 MTP layer is implemented"
        )
    b = _Builder(cfg)  # type: ignore[arg-type]  (reads only cfg.quant)
    h, n = t.hidden_size, t.hc_mult
    for name in ("enorm.weight", "hnorm.weight", "norm.weight"):
        b.plain(MTP_PREFIX + name, (h,), "BF16", also=("F32",))
    b.matrix(MTP_PREFIX + "eh_proj.weight", h, 2 * h, TensorKind.FP8_BLOCK)
    b.plain(MTP_PREFIX + "hc_head_fn", (n, n * h), "F32")
    b.plain(MTP_PREFIX + "hc_head_base", (n,), "F32")
    b.plain(MTP_PREFIX + "hc_head_scale", (1,), "F32")
    block = _Builder(cfg)  # type: ignore[arg-type]
    plan = mtp_plan(t)
    _layer(block, t, plan)
    inner = f"layers.{plan.index}."
    for name, spec in block.out.items():
        b.out[MTP_PREFIX + name.removeprefix(inner)] = spec
    return b.out


_ROW_INPUTS = ("token_ids", "positions", "seq_ids", "seq_slot", "seq_start", "seq_end", "seq_window_start")


def mtp_step_types(model: Any) -> dict[str, TensorType]:
    """Step inputs: what a sliding-window layer reads of the target step's layout, the sample rows, and
    `hidden` [tokens, H] f32, the target's final hidden state per row."""
    target = model.step_types()
    types = {k: target[k] for k in (*_ROW_INPUTS, "sample_rows")}
    types["hidden"] = TensorType(("tokens", model.cfg.text.hidden_size), "f32")
    return types


def mtp_cache_types(model: Any) -> dict[str, TensorType]:
    """The MTP block's own ring, named as backbone layer L's."""
    t, plan = model.cfg.text, mtp_plan(model.cfg.text)
    return {
        f"swa.{plan.index}": TensorType(
            ("slots", model.geo.ring_len, entry_bytes(CACHE_FMT, t.head_dim)), "u8"
        )
    }


def aliased(weights: Mapping[str, Any], layer: int) -> dict[str, Any]:
    """`mtp.0.*` under the names the backbone's block and head read; embed and head weights as they are."""
    out = {k: v for k, v in weights.items() if not k.startswith(MTP_PREFIX)}
    for k, v in weights.items():
        if k.startswith(MTP_PREFIX):
            rest = k.removeprefix(MTP_PREFIX)
            out[rest if rest in _LEAVES or rest in _HEAD else f"layers.{layer}.{rest}"] = v
    return out


def mtp_streams(f: Forward, hidden: Any) -> Any:
    """The block's input streams [T, n, H]: eh_proj([hnorm(hidden); enorm(embed(token_ids))]) copied into
    the hc_mult streams. `f` reads the aliased weights (`aliased`)."""
    t, s = f.text, f.step
    e = f.norm(f.cast(op.gather_rows(f.w("embed.weight"), s["token_ids"]), f.num.act_dtype), "enorm.weight")
    g = f.norm(f.cast(hidden, f.num.act_dtype), "hnorm.weight")
    x = f.linear(op.concat(g, e, axis=1), "eh_proj.weight")
    return op.broadcast_to(
        op.reshape(x, shape=("tokens", 1, t.hidden_size)), shape=("tokens", t.hc_mult, t.hidden_size)
    )


def _forward(f: Forward, model: Any) -> dict[str, Any]:
    from dsgraph.models.deepseek_v4.model import _block, _hc_head

    x = _block(f, mtp_plan(f.text), mtp_streams(f, f.step["hidden"]), 0)
    return {"logits": head(f, x, _hc_head(f, x)), "caches": dict(f.new_caches)}


def trace_mtp(model: Any, weights: Mapping[str, TensorType], *, name: str = "v4_mtp") -> Graph:
    """The MTP graph of a V4 model: inputs `weights.*` (`mtp.0.*`, `embed.weight`, `head.weight`),
    `caches.swa.L`, `step.*` (`mtp_step_types`); outputs `logits` [outs, V] f32 and `caches.swa.L`."""
    layer = mtp_plan(model.cfg.text).index
    step_in = mtp_step_types(model)

    def run(weights: dict[str, Any], caches: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        f = Forward(model.cfg.text, model.num, aliased(weights, layer), step, caches)  # type: ignore[arg-type]
        return _forward(f, model)

    return make_graph(run, dict(weights), mtp_cache_types(model), step_in, name=name)
