"""Drafting with a V4 checkpoint's MTP layer: what the target step writes for it, and the draft pass.

The MTP layer (mtp.py) pairs the token t_p of position p with the target's final hidden state h_{p-1}
and runs one sliding-window block over those rows, so drafting needs two per-slot rings, both written by
every target step (prefill chunks, decode and verify rows alike) and read by the draft pass:

- `mtp.hidden` [slots, ring_len, 4H] u8: each row's h_p as f32 (`prev_hidden` reads h_{p-1} from it for a
  chunk's first row, and for the draft's anchor);
- `mtp.swa` [slots, ring_len, entry] u8: the MTP block's own keys. The target step computes each row's
  (h_{p-1}, t_p) block input and writes its key (only the attention's key path runs there: the block's
  output is not needed until a draft), so the ring covers every position the target has run.

Rows of rejected drafts leave entries past the committed length in both rings; the next step rewrites
them before anything reads them (a draft at anchor position a reads positions below a; a chunk's first row
reads position p - 1, which the step that emitted its token ran). Position 0 pairs t_0 with a zero state
(`prev_hidden` gives zeros there), which hnorm keeps zero.

The draft pass for anchor t_a at position a (the newest token, sampled but not yet run through the
target) is the MTP graph on (h_{a-1}, t_a) alone: its logits give the one draft d_0 for position a + 1,
drawn with the request's sampling parameters on stream `stream` keyed on (seed, a + 1), and
`draft_logprobs` the processed distribution it was drawn from (the p_d of exact verification). It writes
no cache (its key write is dead and removed), so a captured padding pass changes nothing. The MTP layer
has no confidence head: `confidence` is the draft's top probability under the unprocessed softmax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.graph.passes.dce import dce
from dsgraph.models.deepseek_v4.attention_block import CACHE_FMT, _swa_kv
from dsgraph.models.deepseek_v4.mtp import MTP_PREFIX, aliased, mtp_plan, mtp_streams
from dsgraph.models.deepseek_v41.backbone import _hc, head
from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.dspark import DRAFT_STREAM, draw
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest, request_columns
from dsgraph.ops import op
from dsgraph.ops.quant import entry_bytes

__all__ = [
    "HIDDEN_RING",
    "MTP_RING",
    "draft_inputs",
    "draft_types",
    "is_context_weight",
    "is_draft_weight",
    "mtp_ring_types",
    "trace_draft",
    "write_context",
]

HIDDEN_RING, MTP_RING = "mtp.hidden", "mtp.swa"
# what the target step reads of the MTP layer: the block input and its attention's key path
_CONTEXT = ("enorm.", "hnorm.", "eh_proj.", "hc_attn_", "attn_norm.", "attn.wkv.", "attn.kv_norm.")
_SAMPLING = ("temperature", "top_p", "top_k", "min_p")


def mtp_ring_types(model: Any) -> dict[str, TensorType]:
    """The two rings a drafting V4 model adds to its caches."""
    t, ring = model.cfg.text, model.geo.ring_len
    return {
        HIDDEN_RING: TensorType(("slots", ring, entry_bytes("f32", t.hidden_size)), "u8"),
        MTP_RING: TensorType(("slots", ring, entry_bytes(CACHE_FMT, t.head_dim)), "u8"),
    }


def is_context_weight(name: str) -> bool:
    """Whether the target step of a drafting model reads weight `name`."""
    return name.startswith(MTP_PREFIX) and name.removeprefix(MTP_PREFIX).startswith(_CONTEXT)


def is_draft_weight(name: str) -> bool:
    """Whether the draft graph reads weight `name`: the MTP layer and the shared embedding and head."""
    return name in ("embed.weight", "head.weight") or name.startswith(MTP_PREFIX)


def _mtp_forward(f: Forward, ring: Tracer) -> tuple[Forward, str]:
    """A Forward over the MTP layer's weights aliased as backbone layer L's, with `ring` as `swa.L`."""
    layer = mtp_plan(f.text).index  # type: ignore[arg-type]  (V4's text config)
    name = f"swa.{layer}"
    g = Forward(f.text, f.num, aliased(f.weights, layer), f.step, {name: ring})
    return g, name


def write_context(f: Forward, hidden: Tracer) -> None:
    """In the target step: write each row's hidden state [T, H] and its MTP block key into the rings."""
    s = f.step
    h = f.cast(hidden, "f32")
    f.record("mtp.hidden", h)
    rows = (s["positions"], s["seq_ids"], s["seq_slot"])
    prev = op.prev_hidden(f.caches[HIDDEN_RING], *rows, s["seq_start"], h)
    f.new_caches[HIDDEN_RING] = op.swa_write(
        f.caches[HIDDEN_RING], op.cache_encode(h, fmt="f32"), *rows, s["seq_end"]
    )
    g, name = _mtp_forward(f, f.caches[MTP_RING])
    plan = mtp_plan(f.text)  # type: ignore[arg-type]
    x = mtp_streams(g, prev)
    pre, _post, _comb = _hc(g, x, f"layers.{plan.index}.hc_attn")
    u = g.norm(op.hc_collapse(x, pre, out_dtype=f.num.act_dtype), f"layers.{plan.index}.attn_norm.weight")
    _swa_kv(g, plan, u)  # type: ignore[arg-type]  (reads only plan.index, rope_theta, use_yarn)
    f.new_caches[MTP_RING] = g.new_caches[name]


def draft_types(model: Any) -> dict[str, TensorType]:
    """Step inputs of the draft pass: one row per sequence (`tokens` = `seqs`), the anchor."""
    i32 = "i32"
    types = {k: TensorType(("tokens",), i32) for k in ("token_ids", "positions", "seq_ids")}
    for k in ("seq_slot", "seq_start", "seq_end", "seq_window_start", "sample_rows", "top_k"):
        types[k] = TensorType(("seqs",), i32)
    for k in ("temperature", "top_p", "min_p"):
        types[k] = TensorType(("seqs",), "f32")
    types["seed"] = TensorType(("seqs",), "i64")
    return types


def _confidence(logits: Tracer) -> Tracer:
    """[seqs, V] f32 -> [seqs, 1]: the largest softmax probability, 1 / sum(exp(logits - max))."""
    top = op.reduce_max(logits, axes=(-1,), keepdims=True)
    return 1.0 / op.reduce_sum(op.exp(logits - top), axes=(-1,), keepdims=True)


def _draft(f: Forward, stream: int, greedy: bool) -> dict[str, Any]:
    from dsgraph.models.deepseek_v4.model import _block, _hc_head

    s = f.step
    prev = op.prev_hidden(f.caches[HIDDEN_RING], s["positions"], s["seq_ids"], s["seq_slot"], s["seq_start"])
    g, _name = _mtp_forward(f, f.caches[MTP_RING])
    x = _block(g, mtp_plan(f.text), mtp_streams(g, prev), 0)  # type: ignore[arg-type]
    logits = head(g, x, _hc_head(g, x))  # [seqs, V] f32
    params = [s[k] for k in _SAMPLING]
    position = op.gather_rows(s["positions"], s["sample_rows"]) + 1
    token, logprobs = draw(logits, params, s["seed"], position, stream, greedy)
    out = {"draft_tokens": op.reshape(token, shape=("seqs", 1))}
    if logprobs is not None:
        out["draft_logprobs"] = op.reshape(logprobs, shape=("seqs", 1, f.text.vocab_size))
    return {**out, "confidence": _confidence(logits)}


def trace_draft(
    model: Any,
    weights: Mapping[str, TensorType],
    *,
    stream: int = DRAFT_STREAM,
    greedy: bool = False,
    name: str = "v4_mtp_draft",
) -> Graph:
    """The draft graph: inputs `weights.*` (`is_draft_weight`), `caches.mtp.hidden` and `caches.mtp.swa`,
    `step.*` (`draft_types`); outputs `draft_tokens` [seqs, 1] i32, `draft_logprobs` [seqs, 1, V] f32 and
    `confidence` [seqs, 1] f32. `stream`: the draws' counter stream (0 in the runtime's deterministic mode,
    the target's own stream). `greedy`: the variant for passes of greedy requests only (dspark.draw): the
    same tokens, no `draft_logprobs`."""
    rings = mtp_ring_types(model)

    def draft(weights: dict[str, Any], caches: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        f = Forward(model.cfg.text, model.num, weights, step, caches)
        return _draft(f, stream, greedy)

    return dce(make_graph(draft, dict(weights), rings, draft_types(model), name=name))


def draft_inputs(requests: Sequence[DraftRequest], num_seqs: int) -> dict[str, torch.Tensor]:
    """Values of `draft_types` for `requests`, padded with padding sequences (seq_ids -1) to `num_seqs`."""
    if num_seqs < max(len(requests), 1):
        raise ValueError(
            f"draft_inputs: num_seqs is {num_seqs}, expected >= max(1, {len(requests)} requests)"
        )
    pad = DraftRequest(anchor=0, position=0, slot=0)
    rows = [*requests, *([pad] * (num_seqs - len(requests)))]
    n = len(requests)
    cols = {
        "token_ids": [r.anchor for r in rows],
        "positions": [r.position for r in rows],
        "seq_ids": [s if s < n else -1 for s in range(num_seqs)],
        "seq_slot": [r.slot for r in rows],
        "seq_start": [r.position for r in rows],
        "seq_end": [r.position + 1 for r in rows],
        "seq_window_start": [r.window_start for r in rows],
        "sample_rows": list(range(num_seqs)),
        "top_k": [r.top_k for r in rows],
    }
    return request_columns(cols, rows)
