"""Ops of the DSpark drafter (spec model-v41 7.2): block attention over the target's context ring, and the
processed sampling distribution that exact speculative sampling compares against.

`draft_attention` follows the step layout of `dsgraph.ops.cache` with one difference: the rows of a
sequence are one draft block that attends to itself bidirectionally, and `seq_start[s]` is the block's
first position (the anchor position a), so the context is the ring's positions strictly before a.
"""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import TensorType
from dsgraph.ops.attention import require_swa_operands
from dsgraph.ops.cache import require_index
from dsgraph.ops.sampling import require_allowed, require_logits

__all__ = ["DraftAttentionParams", "SamplingLogprobsParams", "draft_attention", "sampling_logprobs"]


@params
class DraftAttentionParams:
    window: int
    softmax_scale: float
    block_size: int  # the most rows a sequence has (a static bound: no platform reads it from the data)


def _draft_attention_rule(p: DraftAttentionParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if not isinstance(p.block_size, int) or isinstance(p.block_size, bool) or p.block_size <= 0:
        raise ShapeError(f"param block_size is {p.block_size!r}, expected a positive int")
    require_swa_operands(p.window, ts, kv_like_q=True)
    return (ts[0],)


draft_attention = declare_op(
    "draft_attention",
    DraftAttentionParams,
    _draft_attention_rule,
    "`q [tokens, nh, hd] float, kv [tokens, hd] (dtype of q; the block's keys, already fp8_g32 qdq'ed), "
    "ring [slots, R, hd + hd/32] u8 (fp8_g32 context keys; R >= window), sink [nh] f32, "
    "positions [tokens] i32, seq_ids [tokens] i32, seq_slot [seqs] i32, seq_start [seqs] i32 (the block's "
    "first position a), seq_window_start [seqs] i32` -> `[tokens, nh, hd]` dtype of q. The rows of "
    "sequence s (contiguous, at most block_size) are one draft block. Keys of each of its rows: the context "
    "positions max(0, seq_window_start[s], a - window) .. a - 1 decoded from ring[seq_slot[s], pos % R], "
    "then the kv rows of every row of the block in row order (bidirectional: later rows included). "
    "logits = (q_h . k) * softmax_scale; P = exp(logit) / (sum over keys of exp(logit) + exp(sink_h)); "
    "out_h = sum P * k (V = K). f32 math, each row on its own; padding rows (seq_ids < 0) give zeros.",
    num_inputs=9,
)


@params
class SamplingLogprobsParams:
    """No params; a distinct type keeps the op self-describing in dumps."""


def _sampling_logprobs_rule(_p: SamplingLogprobsParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if len(ts) not in (5, 6):
        raise ShapeError(f"takes 5 operands, or 6 with the allowed-token bitmask, got {len(ts)}")
    outs, vocab = require_logits(ts[0])
    for t, dtype, what in zip(
        ts[1:5], ("f32", "f32", "i32", "f32"), ("temperature", "top_p", "top_k", "min_p"), strict=True
    ):
        require_index(t, outs, what, dtype=dtype)
    if len(ts) == 6:
        require_allowed(ts[5], outs, vocab)
    return (ts[0],)


sampling_logprobs = declare_op(
    "sampling_logprobs",
    SamplingLogprobsParams,
    _sampling_logprobs_rule,
    "`logits [outs, V] f32, temperature [outs] f32, top_p [outs] f32, top_k [outs] i32, min_p [outs] f32"
    "[, allowed [outs, ceil(V/32)] i32]` -> `logprobs [outs, V] f32`: the log-probabilities, in vocabulary "
    "order, of the processed distribution the `sample` op draws from with the same operands (mask, "
    "temperature or greedy at temperature 1, top-k, top-p, min-p; ops/sampling.py), -inf for every token "
    "the processing cuts; a row that allows no finite logit is all -inf. So "
    "logprobs[t, sample(...).token[t]] equals sample(...).logprob[t].",
)
