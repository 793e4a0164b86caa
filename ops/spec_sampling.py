"""Speculative verification: accept or reject the drafts of a verify step and emit the tokens (spec 7.3).

A verify step runs sequence s's rows [anchor, d_0 .. d_{k-1}] at positions a .. a+k; row j's logits give
the target distribution p_t of position a+j+1, whose draft is d_j (j < k). The op sees the rows whose
logits are wanted (`outs`); sequence s owns rows verify_start[s] .. verify_start[s] + verify_len[s] - 1
(L = verify_len = k + 1), the last of which (the bonus row) has no draft. Per row, `position` is the
position of the token decided there (a+j+1), and p_t is the `sample` op's processed distribution (mask,
temperature, top-k, top-p, min-p; ops/sampling.py) under the row's own parameters.

Row j < L-1 (a draft row), draft d = draft_token, p_d = softmax(draft_logprobs) (the draft's distribution):
- greedy row (temperature < GREEDY_BELOW): accept iff d is the target argmax (lowest id on ties);
  otherwise the row's token is that argmax;
- sampled row: accept iff u_accept * p_d(d) < p_t(d) (probability min(1, p_t(d) / p_d(d)), no division);
  otherwise the token is drawn from normalize(max(0, p_t - p_d)) with u_residual (inverse CDF over the
  target's sorted order). There is no residual penalty, so the emitted token is distributed exactly as
  p_t. When the residual is all zero, p_t <= p_d everywhere; both sum to one, so p_t == p_d and every
  draft is accepted: the branch is unreachable in exact arithmetic. A rounding-level rejection with an
  empty residual draws from p_t itself with u_residual (mass of that event <= the rounding of the sums).
  The residual gives the rejected token no mass (p_t(d) < p_d(d)), so a rejected draft is never re-emitted.
The bonus row L-1 is the `sample` op's ordinary draw (stream 0), so a sequence without drafts (L = 1) is
exactly a decode step's sample.

Uniforms come from the `sample` op's counter RNG, keyed on (seed, 4 * position + stream) only, stream 0
ordinary (bonus row), 1 the acceptance test, 2 the residual draw; so a row's outcome depends on its own
logits, draft, parameters, seed and position, never on the batch, the row's place in it, or bucketing.

num_accepted[s] = n, the number of leading accepted drafts; the sequence emits n + 1 tokens: row j < n
holds d_j, row n the target's token (the residual/argmax token on rejection, the bonus token when n =
L-1). Rows after n, rows of no sequence and rows whose bitmask allows no finite logit (which reject their
draft) hold token -1, logprob -inf; a sequence with verify_len 0 has num_accepted -1 (emits nothing).
logprob is the emitted token's log-probability under p_t (as the `sample` op reports it).
"""

from __future__ import annotations

from dsgraph.graph.op import NoParams, ShapeError, declare_op
from dsgraph.graph.types import TensorType
from dsgraph.ops import rules as R
from dsgraph.ops.cache import require_index
from dsgraph.ops.sampling import require_allowed, require_logits

__all__ = ["STREAM_ACCEPT", "STREAM_RESIDUAL", "spec_verify"]

STREAM_ACCEPT = 1  # the acceptance test's uniform
STREAM_RESIDUAL = 2  # the draw from the residual after a rejection

_ROW_OPERANDS = (
    ("draft_token", "i32"),
    ("temperature", "f32"),
    ("top_p", "f32"),
    ("top_k", "i32"),
    ("min_p", "f32"),
    ("seed", "i64"),
    ("position", "i32"),
)


def _spec_verify_rule(_p: NoParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if len(ts) not in (11, 12):
        raise ShapeError(f"takes 11 operands, or 12 with the allowed-token bitmask, got {len(ts)}")
    logits, draft_logprobs = ts[0], ts[2]
    outs, vocab = require_logits(logits)
    R.require_dtype(draft_logprobs, ("f32",), "draft_logprobs")
    if draft_logprobs.shape != logits.shape:
        raise ShapeError(f"draft_logprobs must have the shape of logits {logits}, got {draft_logprobs}")
    for t, (what, dtype) in zip(ts[1:2] + ts[3:9], _ROW_OPERANDS, strict=True):
        require_index(t, outs, what, dtype=dtype)
    R.require_dtype(ts[9], ("i32",), "verify_start")
    R.require_rank(ts[9], 1, "verify_start")
    seqs = ts[9].shape[0]
    require_index(ts[10], seqs, "verify_len")
    if len(ts) == 12:
        require_allowed(ts[11], outs, vocab)
    return TensorType((seqs,), "i32"), TensorType((outs,), "i32"), TensorType((outs,), "f32")


spec_verify = declare_op(
    "spec_verify",
    NoParams,
    _spec_verify_rule,
    "`logits [outs, V] f32, draft_token [outs] i32, draft_logprobs [outs, V] f32, temperature [outs] f32, "
    "top_p [outs] f32, top_k [outs] i32, min_p [outs] f32, seed [outs] i64, position [outs] i32, "
    "verify_start [seqs] i32, verify_len [seqs] i32[, allowed [outs, ceil(V/32)] i32]` -> "
    "`(num_accepted [seqs] i32, token [outs] i32, logprob [outs] f32)`: sequence s's rows are "
    "verify_start[s] + 0..verify_len[s]-1, the last one the bonus row; each draft row accepts its draft "
    "(greedy: iff it is the target argmax; sampled: with probability min(1, p_t/p_d)) or emits a token of "
    "normalize(max(0, p_t - p_d)) (exact speculative sampling, no penalty); the bonus row is the `sample` "
    "op's draw. Uniforms keyed on (seed, 4 * position + stream), streams 0 bonus, 1 accept, 2 residual. "
    "num_accepted = leading accepted drafts; rows 0..num_accepted of a sequence hold its emitted tokens and "
    "their target log-probabilities, later rows -1 / -inf (module doc of dsgraph.ops.spec_sampling).",
)
