"""The DSpark drafter as one traced graph (spec model-v41 7.2; deepinfer-parity 5.1-5.2, 7b-7d).

One pass drafts K = dspark_block_size tokens per sequence: the block [t_a, NOISE x (K-1)] at positions
a .. a+K-1 runs through the stages `mtp.0..` (each a V4.1 block: SWA-only attention, MoE with the draft's
expert count, two mHC sites, single-pass pre-mix handoff across stages). A stage's attention reads the
context keys of positions a-window .. a-1 from its ring `dspark.ring{s}` (written by the target step,
dspark_context.py), the whole block bidirectionally, and the sink. Then, slot by slot (the only
sequential part), with h_k the last stage's streams collapsed by its FFN pre-mix (pre-norm):

    U_k = head(mtp.L.norm(h_k))                      the shared target head, f32
    e_k = markov_head.embed[prev_k]                  prev_0 = t_a, prev_{k+1} = d_k
    logits_k = U_k + markov_head.head(e_k)           the Markov correction, f32
    d_k = sample(logits_k)                           the request's temperature, top-k/p, min-p
    confidence_k = sigmoid(confidence_head.proj . [h_k ; e_k])

Confidence input: the pre-norm h_k. DeepInfer (which serves the released weights) feeds the last stage's
collapsed state before the post-norm (`hidden_states_before_norm`, parity 5.2 and 7d), and vLLM's
official path does the same (spec 7.2); NeMo feeds the post-norm state and its own docstring says
AutoModel-trained drafts differ from the released raw-residual input. `confidence_input="post_norm"`
exists only to compare with NeMo. DeepInfer's optional confidence temperature (default 1) and its
clamp of the logit to +-60 (no effect on an f32 sigmoid) are not modelled.

Draws: `sample` stream DRAFT_STREAM (3) keyed on (seed, position a+k+1), so a draft's uniform is
independent of the verification's streams 0-2 at the same position (ops/spec_sampling.py) and never
depends on the batch. `draft_logprobs` is the processed distribution the draw used (`sampling_logprobs`),
the p_d of exact speculative sampling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.models.deepseek_v41.attention_block import _output
from dsgraph.models.deepseek_v41.backbone import _collapse, _hc, embed
from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.dspark_context import context_key, ring_name
from dsgraph.models.deepseek_v41.dspark_io import draft_types
from dsgraph.models.deepseek_v41.ffn_block import moe
from dsgraph.models.deepseek_v41.layers_plan import LayerPlan, draft_plans
from dsgraph.models.deepseek_v41.model import V41Model
from dsgraph.ops import op

__all__ = ["DRAFT_STREAM", "ConfidenceInput", "draft_cache_types", "draw", "trace_draft"]

DRAFT_STREAM = 3  # the `sample` op's counter stream of draft draws (0-2 belong to verification)
ConfidenceInput = Literal["pre_norm", "post_norm"]


def draft_cache_types(model: V41Model) -> dict[str, TensorType]:
    """The caches the draft graph reads: the context rings (it writes none)."""
    types = model.cache_types()
    return {ring_name(s): types[ring_name(s)] for s in range(model.cfg.text.num_nextn_predict_layers)}


def _attention(f: Forward, plan: LayerPlan, stage: int, u: Tracer) -> Tracer:
    """The stage's attention of the block rows u [T, H] over its context ring and the block itself."""
    p, t, s = f"mtp.{stage}.attn.", f.text, f.step
    c = f.norm(f.linear(u, p + "wq_a.weight"), p + "q_norm.weight")
    q = op.reshape(f.linear(c, p + "wq_b.weight"), shape=("tokens", t.num_attention_heads, t.head_dim))
    q = f.rope(q, s["positions"], plan.rope_theta, plan.use_yarn)
    kv = context_key(f, stage, u, s["positions"])  # the block's own keys, not kept after the pass
    f.record(f"kv_pre.{plan.index}", kv)
    kv = f.cast(op.act_qdq(kv, fmt="fp8_g32"), q.dtype)
    o = op.draft_attention(
        q,
        kv,
        f.caches[ring_name(stage)],
        f.w(p + "attn_sink"),
        s["positions"],
        s["seq_ids"],
        s["seq_slot"],
        s["seq_start"],
        s["seq_window_start"],
        window=t.sliding_window,
        softmax_scale=float(t.head_dim**-0.5),
        block_size=t.dspark_block_size,
    )
    return _output(f, plan, o, prefix=p)


def _stage(f: Forward, plan: LayerPlan, stage: int, x: Tracer, a: Tracer | None) -> tuple[Tracer, Tracer]:
    """One stage on the streams x [T, n, H] with the handed-over pre-mix `a` (as backbone.block)."""
    p = f"mtp.{stage}."
    pre_a, post_a, comb_a = _hc(f, x, p + "hc_attn")
    u = f.norm(_collapse(f, x, a), p + "attn_norm.weight")
    x = op.hc_expand(_attention(f, plan, stage, u), x, post_a, comb_a)
    pre_f, post_f, comb_f = _hc(f, x, p + "hc_ffn")
    u = f.norm(op.hc_collapse(x, pre_a, out_dtype=f.num.act_dtype), p + "ffn_norm.weight")
    x = op.hc_expand(moe(f, plan.index, u, prefix=p), x, post_f, comb_f)
    return x, pre_f


def _slot(x: Tracer, k: int) -> Tracer:
    """Slot k of a per-block tensor: x [seqs, K, *] -> [seqs, *] (a view on cuda, no launch)."""
    one = op.slice(x, axis=1, start=k, stop=k + 1)
    return op.reshape(one, shape=("seqs", *x.shape[2:]))


def _dense(f: Forward, x: Tracer, name: str) -> Tracer:
    """f32 `x @ W^T` of a plain (BF16/F32) weight, its input cast to the weight's dtype."""
    w = f.w(name)
    return op.linear(f.cast(x, w.dtype), w, out_dtype="f32")


def draw(
    logits: Tracer, params: list[Tracer], seed: Tracer, position: Tracer, stream: int, greedy: bool
) -> tuple[Tracer, Tracer | None]:
    """A draft token per row and the processed log-probabilities it was drawn from (the p_d of exact
    verification). `greedy` (a pass whose requests are all greedy): the token by one argmax ("greedy_token",
    the same token as the full processing) and no log-probabilities: verification never reads a greedy
    row's p_d, and the full processing sorts the vocabulary of every row, twice."""
    if greedy:
        return op.sample(logits, *params, seed, position, stream=stream, processing="greedy_token")[0], None
    token = op.sample(logits, *params, seed, position, stream=stream)[0]
    return token, op.sampling_logprobs(logits, *params)


def _heads(
    f: Forward, h: Tracer, confidence_input: ConfidenceInput, stream: int = DRAFT_STREAM, greedy: bool = False
) -> dict[str, Tracer]:
    """The sequential Markov head and the confidence head over the collapsed last-stage state h [T, H].

    Only the draws are sequential (slot k's Markov correction reads the token of slot k-1). The shared
    head's U runs once over every block row [T, V] and the confidence head once over every (sequence,
    slot) [seqs, K, H + rank] after the draws (one read of each weight per pass, not one per slot); the
    dense linear is batch invariant, so each row keeps the bits of a per-slot pass. Returns [seqs, K, *]
    outputs; `base`/`logits` only with debug, `logprobs` only without `greedy`."""
    t, s = f.text, f.step
    last = f"mtp.{t.num_nextn_predict_layers - 1}."
    params = [s[n] for n in ("temperature", "top_p", "top_k", "min_p")]
    rows = s["block_rows"]  # [seqs, K]
    normed_rows = f.norm(h, last + "norm.weight")
    base_rows = _dense(f, normed_rows, "head.weight")  # U of every block row [T, V]
    positions = op.gather_rows(s["positions"], rows) + 1  # slot k drafts the token of position a+k+1
    embed_w = f.w(last + "markov_head.embed.weight")
    prev = op.gather_rows(s["token_ids"], _slot(rows, 0))  # the anchor
    outs: dict[str, list[Tracer]] = {}
    for k in range(t.dspark_block_size):
        e_k = op.gather_rows(embed_w, prev)  # [seqs, rank]
        base = op.gather_rows(base_rows, _slot(rows, k))  # U_k [seqs, V]
        logits = base + _dense(f, e_k, last + "markov_head.head.weight")
        token, logprobs = draw(logits, params, s["seed"], _slot(positions, k), stream, greedy)
        pieces = {"tokens": token, "e": e_k}
        if logprobs is not None:
            pieces["logprobs"] = logprobs
        if f.debug is not None:
            pieces.update(base=base, logits=logits)
        for name, value in pieces.items():
            outs.setdefault(name, []).append(op.reshape(value, shape=("seqs", 1, *value.shape[1:])))
        # a dead row (no finite logit, as a padding row of a capture's warm-up step can be) draws -1; its
        # later slots are discarded, but their embedding lookup must stay inside the table
        prev = op.maximum(token, 0)
    result = {name: op.concat(*values, axis=1) for name, values in outs.items()}
    state = op.gather_rows(h if confidence_input == "pre_norm" else normed_rows, rows)  # h_k [seqs, K, H]
    features = op.concat(f.cast(state, "f32"), f.cast(result.pop("e"), "f32"), axis=2)
    confidence = op.sigmoid(_dense(f, features, last + "confidence_head.proj.weight"))  # [seqs, K, 1]
    return {**result, "confidence": confidence}


def trace_draft(
    model: V41Model,
    weights: Mapping[str, TensorType],
    *,
    name: str = "v41_draft",
    debug: bool = False,
    confidence_input: ConfidenceInput = "pre_norm",
    stream: int = DRAFT_STREAM,
    greedy: bool = False,
) -> Graph:
    """The draft graph: inputs `weights.*` (`dspark_context.is_draft_weight`), `caches.dspark.ring{s}`,
    `step.*` (dspark_io.draft_types); outputs `draft_tokens` [seqs, K] i32, `draft_logprobs`
    [seqs, K, V] f32 and `confidence` [seqs, K] f32. With `debug`, also `debug.base_logits` (U_k) and
    `debug.draft_logits` (Markov-corrected) [seqs, K, V] f32 and `debug.kv_pre.{stage index}` [T, hd].
    `stream`: the draws' counter stream; the runtime's deterministic mode passes 0, the target's own
    `sample` stream, so a draft equals the target's draw wherever the two distributions agree.
    `greedy`: the variant for passes whose requests are all greedy (`draw`): the same tokens and
    confidences, no `draft_logprobs` output."""
    if confidence_input not in ("pre_norm", "post_norm"):
        raise ValueError(
            f"trace_draft: confidence_input {confidence_input!r} is not 'pre_norm' or 'post_norm'"
        )
    text = model.cfg.text

    def draft(weights: dict[str, Any], caches: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        f = Forward(
            text,
            model.num,
            weights,
            step,
            caches,
            debug={} if debug else None,
            expert_parallel=model.expert_parallel,
        )
        x, a = embed(f), None
        for k, plan in enumerate(draft_plans(text)):
            x, a = _stage(f, plan, k, x, a)
        collapsed = op.hc_collapse(x, a, out_dtype=model.num.act_dtype)
        heads = _heads(f, collapsed, confidence_input, stream, greedy)
        k = text.dspark_block_size
        out = {"draft_tokens": heads["tokens"]}
        if not greedy:
            out["draft_logprobs"] = heads["logprobs"]
        out["confidence"] = op.reshape(heads["confidence"], shape=("seqs", k))  # [seqs, K, 1] -> [seqs, K]
        if f.debug is not None:
            out["debug"] = {**f.debug, "base_logits": heads["base"], "draft_logits": heads["logits"]}
        return out

    return make_graph(draft, dict(weights), draft_cache_types(model), draft_types(text), name=name)
