"""The sampling op: one token per output row from its logits, with a counter-based random draw.

Per row, in this order (every sort is stable and descending, so equal values keep the lower token id
first):

1. mask: tokens whose bit is 0 in the allowed-token bitmask get logit -inf (structured output);
2. temperature: a row with temperature < GREEDY_BELOW is greedy: it takes the highest logit (ties to the
   lowest id) and skips steps 3-5; otherwise the logits are divided by the temperature;
3. top-k: keep the k highest (k < 1 or k >= V is off; ties at the boundary keep the lower ids);
4. top-p: of the top-k distribution, keep the shortest prefix of the sorted tokens whose mass reaches
   top_p (the first token always; top_p >= 1 is off);
5. min-p: of the top-p distribution, keep the tokens with probability >= min_p * the highest (0 is off);
6. draw: u = the uniform of the row's (seed, position, stream) counter (below); the token is the first
   of the kept tokens, in the sorted order, whose cumulative probability exceeds u * their total.

Each step keeps a prefix of the sorted order, so the processed distribution is softmax over the kept
tokens (-inf elsewhere); a greedy row's processed distribution is the masked logits at temperature 1.
Logits are finite or -inf (a +inf or NaN logit makes the row's results undefined).

The draw depends on the row's own seed and position only (never on the batch or the row's place in it):
    counter = 4 * position + stream      (stream 0: ordinary samples; 1..3: reserved for verification)
    z = mix64(seed + (counter + 1) * 0x9E3779B97F4A7C15)      (64-bit wraparound)
    u = (z >> 11) * 2**-53                                      (logical shift; u in [0, 1))
with mix64 SplitMix64's finaliser (Steele, Lea, Flood 2014): z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31. For stream 0 and position p, z is output number
p + 1 of a SplitMix64 generator seeded with `seed`.

The static param `processing` lets a caller that knows its rows' params skip steps that cannot change
any row's result (the outputs are the same bits as "full" for the rows it admits; on other rows they are
undefined):
    "full"         every step, for any rows;
    "untruncated"  skips steps 3-5: for rows where each is greedy, or has top_k off (< 1 or >= V),
                   top_p >= 1 and min_p <= 0 (as the f32/i32 operands hold them), each step keeps all
                   the finite tokens, which is what is kept without them;
    "greedy"       also skips the draw (step 6): for rows that are all greedy, which take rank 0;
    "greedy_token" the token alone, by one argmax instead of the sort: for rows that are all greedy and
                   whose log-probabilities nobody reads (logprob and top_logprobs are NaN, top_ids -1:
                   not computed); the tokens are "full"'s, -1 on dead rows included.
"""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import TensorType
from dsgraph.ops import rules as R
from dsgraph.ops.cache import require_index

__all__ = ["GREEDY_BELOW", "MAX_STREAM", "PROCESSING", "SampleParams", "mask_words", "sample"]

# Temperatures below this sample greedily: logits / 1e-5 already make the draw an argmax in all but exact
# ties, and DeepInfer uses the same threshold (deepinfer-parity 1.5).
GREEDY_BELOW = 1e-5
MAX_STREAM = 3
# The `processing` variants (module doc), from the one that does everything to the one that does least.
PROCESSING = ("full", "untruncated", "greedy", "greedy_token")


def mask_words(vocab_size: int) -> int:
    """Words of the allowed-token bitmask of a vocabulary: bit t % 32 of word t // 32 allows token t."""
    return -(-vocab_size // 32)


@params
class SampleParams:
    num_top_logprobs: int = 0
    stream: int = 0
    processing: str = "full"


def require_logits(logits: TensorType) -> tuple[object, int]:
    """f32 [outs, V] with a concrete vocabulary; returns (outs, V). Shared by the sampling-family ops."""
    R.require_dtype(logits, ("f32",), "logits")
    R.require_rank(logits, 2, "logits")
    outs, vocab = logits.shape
    if not isinstance(vocab, int) or vocab < 1:
        raise ShapeError(f"vocabulary dim of logits {logits} must be a positive int")
    return outs, vocab


def require_allowed(allowed: TensorType, outs: object, vocab: int) -> None:
    """The allowed-token bitmask: i32 [outs, ceil(V/32)]."""
    R.require_dtype(allowed, ("i32",), "allowed")
    if allowed.shape != (outs, mask_words(vocab)):
        raise ShapeError(f"allowed must have shape [{outs}, {mask_words(vocab)}] (ceil(V/32)), got {allowed}")


def _sample_rule(p: SampleParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    if len(ts) not in (7, 8):
        raise ShapeError(f"takes 7 operands, or 8 with the allowed-token bitmask, got {len(ts)}")
    outs, vocab = require_logits(ts[0])
    names = ("temperature", "top_p", "top_k", "min_p", "seed", "position")
    for t, dtype, what in zip(ts[1:7], ("f32", "f32", "i32", "f32", "i64", "i32"), names, strict=True):
        require_index(t, outs, what, dtype=dtype)
    if len(ts) == 8:
        require_allowed(ts[7], outs, vocab)
    k = p.num_top_logprobs
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= vocab:
        raise ShapeError(f"param num_top_logprobs is {k!r}, expected 0..{vocab} (the vocabulary)")
    if isinstance(p.stream, bool) or not isinstance(p.stream, int) or not 0 <= p.stream <= MAX_STREAM:
        raise ShapeError(f"param stream is {p.stream!r}, expected 0..{MAX_STREAM}")
    if p.processing not in PROCESSING:
        raise ShapeError(f"param processing is {p.processing!r}, expected one of {PROCESSING}")
    return (
        TensorType((outs,), "i32"),
        TensorType((outs,), "f32"),
        TensorType((outs, k), "f32"),
        TensorType((outs, k), "i32"),
    )


sample = declare_op(
    "sample",
    SampleParams,
    _sample_rule,
    "`logits [outs, V] f32, temperature [outs] f32, top_p [outs] f32, top_k [outs] i32, min_p [outs] f32, "
    "seed [outs] i64, position [outs] i32[, allowed [outs, ceil(V/32)] i32]` -> `(token [outs] i32, "
    "logprob [outs] f32, top_logprobs [outs, K] f32, top_ids [outs, K] i32)`, K = num_top_logprobs: "
    "mask (bit t % 32 of allowed[:, t // 32]), temperature (< 1e-5: greedy argmax, lowest id on ties), "
    "top-k (< 1 off), top-p, min-p, then one uniform draw keyed on (seed, 4 * position + stream) by "
    "SplitMix64 (module doc). logprob is the chosen token's log-probability under the processed "
    "distribution; top_ids are the first K tokens of the stable descending order of the masked, scaled "
    "logits, top_logprobs their processed log-probabilities (-inf for tokens cut by top-k/p/min-p). A row "
    "whose bitmask allows no finite logit gives token -1, logprob -inf and top_ids -1. processing "
    '("full", "untruncated": no row truncates, "greedy": every row is greedy, "greedy_token": the same and '
    "no log-probabilities read) skips what cannot change the rows it admits (module doc).",
)
