"""Reference meaning of the `sample` op (dsgraph.ops.sampling), in torch.

Batch invariance: every float step is a per-row kernel along the vocabulary (stable sort, softmax,
log_softmax, cumsum, searchsorted) or exact IEEE arithmetic (division, multiplication, comparison), and
the random draw is integer arithmetic on the row's own seed and position. No elementwise transcendental
runs over the whole [outs, V] tensor (torch rounds those differently on the vector body and the tail,
platform/cpu/invariant.py), so a row's token and log-probabilities are the same bits in any batch.

The processing runs in f64 and keeps, at each step, a prefix of the rows' stable descending order of
the masked, scaled logits (ops/sampling.py); `kept` counts that prefix per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dsgraph.ops.sampling import GREEDY_BELOW

__all__ = ["RULES", "Processed", "allowed_tokens", "draw_rank", "process", "sample", "uniform_draw"]

_NEG_INF = float("-inf")
# Rows processed together: bounds the f64 [rows, V] temporaries (V = 129280 for the real vocabulary).
_ROWS_PER_CHUNK = 16


def _i64(value: int) -> int:
    """A 64-bit pattern as the signed int64 torch stores."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def uniform_draw(seed: Tensor, position: Tensor, stream: int) -> Tensor:
    """f64 uniforms in [0, 1) of rows' (seed, position): SplitMix64 output number 4*position+stream+1.

    int64 multiplication and addition wrap around modulo 2**64 in torch, as the generator needs.
    """
    counter = position.long() * 4 + (stream + 1)
    z = seed.long() + counter * _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 11).double() * 2.0**-53


def allowed_tokens(words: Tensor, vocab_size: int) -> Tensor:
    """[outs, V] bool from the bitmask [outs, ceil(V/32)] i32: bit t % 32 of word t // 32 allows token t."""
    bits = (words.long().unsqueeze(-1) >> torch.arange(32, device=words.device)) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()


def _leading_true(cond: Tensor) -> Tensor:
    """Per row, how many leading elements of a [outs, V] bool are True (the kept prefix): the index of
    the first False (argmax returns the first maximum), V when there is none. Two reductions, where a
    running product over the row would be a scan of int64s."""
    first_false = (~cond).to(torch.uint8).argmax(-1)
    return torch.where(cond.all(-1), cond.shape[-1], first_false)


def _prefix(scores: Tensor, kept: Tensor) -> Tensor:
    """Sorted scores with everything past each row's first `kept` set to -inf."""
    rank = torch.arange(scores.shape[-1], device=scores.device).unsqueeze(0)
    return scores.masked_fill(rank >= kept.unsqueeze(-1), _NEG_INF)


def _truncate(scores: Tensor, kept: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """The kept prefix after top-k, top-p and min-p, each over the distribution the previous one left."""
    vocab = scores.shape[-1]
    k = top_k.long()
    kept = torch.minimum(kept, torch.where((k >= 1) & (k < vocab), k, vocab))
    probs = torch.softmax(_prefix(scores, kept), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1).roll(1, dims=-1)
    p = top_p.double().unsqueeze(-1)
    # The first token always stays; top_p >= 1 keeps all (a rounded mass could otherwise drop the tail).
    in_top_p = (mass_before < p) | (p >= 1.0)
    in_top_p[:, 0] = True  # (also overwrites the total that roll moved to the front)
    kept = torch.minimum(kept, _leading_true(in_top_p))
    probs = torch.softmax(_prefix(scores, kept), dim=-1)
    in_min_p = probs >= min_p.double().unsqueeze(-1) * probs[:, :1]
    return torch.minimum(kept, _leading_true(in_min_p))


def _draw(log_probs: Tensor, kept: Tensor, u: Tensor) -> Tensor:
    """Sorted ranks [outs, 1]: the first whose cumulative probability exceeds u * the kept total."""
    cdf = torch.cumsum(torch.softmax(log_probs, dim=-1), dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    rank = torch.searchsorted(cdf, target, right=True)
    # u < 1 keeps the rank inside the kept prefix; the bound only matters for rows without a finite logit.
    return torch.minimum(rank, (kept - 1).clamp_min(0).unsqueeze(-1))


@dataclass(frozen=True)
class Processed:
    """Rows' processed distributions in their stable descending order of the masked, scaled logits."""

    log_probs: Tensor  # [outs, V] f64, sorted order; -inf past `kept`
    order: Tensor  # [outs, V] i64: token id at each sorted rank
    kept: Tensor  # [outs] i64: tokens the processing keeps (a prefix of the order)
    greedy: Tensor  # [outs] bool: temperature < GREEDY_BELOW
    finite: Tensor  # [outs] i64: tokens with a finite masked logit (0: the row is dead)


def process(
    logits: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    top_k: Tensor,
    min_p: Tensor,
    processing: str = "full",
) -> Processed:
    """Temperature, top-k, top-p, min-p of rows whose masked tokens already hold -inf (module doc).

    `processing` other than "full" promises rows that do not truncate (ops/sampling.py): on those,
    `_truncate` keeps every finite token (top-k off keeps min(finite, V); top_p >= 1 keeps all; min_p <= 0
    keeps all of a live row, whose probabilities are >= 0 >= min_p * the highest, and none of a dead
    row, whose NaN probabilities compare False, which is its finite count 0), so it is skipped."""
    greedy = temperature < GREEDY_BELOW
    scores = logits.double() / torch.where(greedy, 1.0, temperature.double()).unsqueeze(-1)
    scores, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    finite = (scores > _NEG_INF).sum(-1)
    if processing == "full":
        kept = torch.where(greedy, finite, _truncate(scores, finite, top_k, top_p, min_p))
    else:
        kept = finite
    log_probs = torch.log_softmax(_prefix(scores, kept), dim=-1)
    return Processed(log_probs, order, kept, greedy, finite)


def draw_rank(d: Processed, u: Tensor) -> Tensor:
    """Sorted ranks [outs, 1] of the op's draw with uniforms `u` (rank 0 on greedy rows)."""
    return torch.where(d.greedy.unsqueeze(-1), 0, _draw(d.log_probs, d.kept, u))


def _sample_rows(
    p: Any, logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, min_p: Tensor, u: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The op on a chunk of rows whose masked tokens already hold -inf; `u` their uniforms."""
    d = process(logits, temperature, top_p, top_k, min_p, p.processing)
    log_probs, order, finite = d.log_probs, d.order, d.finite
    # "greedy" promises greedy rows only, whose rank draw_rank sets to 0 whatever the draw gives
    rank = (
        torch.zeros_like(u, dtype=torch.long).unsqueeze(-1) if p.processing == "greedy" else draw_rank(d, u)
    )
    token = order.gather(-1, rank).squeeze(-1)
    logprob = log_probs.gather(-1, rank).squeeze(-1)
    top_logprobs = log_probs[:, : p.num_top_logprobs]
    top_ids = order[:, : p.num_top_logprobs]
    # A row with no allowed finite logit has NaN log-probabilities: give it the inert outputs instead.
    dead = finite == 0
    token = torch.where(dead, -1, token)
    logprob = logprob.masked_fill(dead, _NEG_INF)
    top_logprobs = top_logprobs.masked_fill(dead.unsqueeze(-1), _NEG_INF)
    top_ids = top_ids.masked_fill(dead.unsqueeze(-1), -1)
    return token.int(), logprob.float(), top_logprobs.float(), top_ids.int()


def _greedy_tokens(p: Any, logits: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ "greedy_token" rows (ops/sampling.py): the highest masked logit, lowest id on ties as in the stable
    sort (argmax returns the first maximum; a greedy row's scores are its logits, exactly), -1 on a row
    with no finite logit; the log-probabilities are not computed."""
    rows, k = logits.shape[0], p.num_top_logprobs
    dead = ~(logits > _NEG_INF).any(-1)
    token = torch.where(dead, -1, logits.argmax(-1))
    nan = float("nan")
    top_ids = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    return token.int(), logits.new_full((rows,), nan), logits.new_full((rows, k), nan), top_ids


def sample(
    p: Any,
    logits: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    top_k: Tensor,
    min_p: Tensor,
    seed: Tensor,
    position: Tensor,
    *allowed: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if allowed:
        logits = logits.masked_fill(~allowed_tokens(allowed[0], logits.shape[-1]), _NEG_INF)
    if p.processing == "greedy_token":
        return _greedy_tokens(p, logits)
    u = uniform_draw(seed, position, p.stream)
    rows = (logits, temperature, top_p, top_k, min_p, u)
    chunks = [
        _sample_rows(p, *(x[start : start + _ROWS_PER_CHUNK] for x in rows))
        for start in range(0, logits.shape[0], _ROWS_PER_CHUNK)
    ]
    if not chunks:  # a step with no sampled rows
        return _sample_rows(p, *rows)
    return tuple(torch.cat(parts) for parts in zip(*chunks, strict=True))  # type: ignore[return-value]


RULES: dict[str, Any] = {"sample": sample}
