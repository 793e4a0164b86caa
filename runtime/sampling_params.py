"""Per-request sampling parameters: vLLM's `SamplingParams` fields and meanings where they overlap
(DeepInfer's fields map onto them; README "Migrating from DeepInfer").

The `sample` op (dsgraph.ops.sampling) consumes one row per output: temperature (< 1e-5 = greedy), top_p,
top_k (-1 = off), min_p (0 = off), a 64-bit seed and the position; `op_row` gives those values.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from dsgraph.ops.sampling import GREEDY_BELOW

if TYPE_CHECKING:
    from dsgraph.runtime.structured.params import StructuredOutputsParams

__all__ = ["MAX_TOP_LOGPROBS", "RequestError", "SamplingParams", "completion_seed", "seed_to_i64"]

MAX_TOP_LOGPROBS = 20
_INT32_MAX = 2**31 - 1
_MASK64 = (1 << 64) - 1


class RequestError(ValueError):
    """A request field holds a value outside its allowed range; names the field, value and expectation."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field}: {value!r} must be {expected}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one request. Field names and meanings follow vLLM's `SamplingParams` where they
    overlap; the defaults follow DeepInfer (temperature 1, top_p 1, top_k off, 16 tokens), as vLLM's do.

    `stop` strings end the text at the match (the match is returned only with
    `include_stop_str_in_output`); `stop_token_ids` end generation after that token, like EOS (which
    `ignore_eos` disables). `min_tokens`: EOS, the stop token ids and the stop strings cannot end a
    completion before it has that many tokens (EOS and stop token ids are masked from the distribution).
    `seed` None draws a fresh random seed per request; a fixed seed makes the tokens depend only on
    (seed, position). `logprobs` None returns no log-probabilities; k >= 0 returns, per generated token,
    the chosen token's and the k most likely tokens' (under the processed distribution, see
    runtime/outputs.py). `prompt_logprobs` k >= 0: each prompt token's log-probability given its prefix
    plus the k most likely there; a request asking for it is computed in full (it bypasses the prefix
    cache), so every position has one. `n` completions of one prompt use seeds derived from `seed`
    (`completion_seed`). `skip_special_tokens`: special tokens are left out of `text`.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Teacher forcing (DeepInfer's golden tokens): the engine emits these ids in order instead of
    # sampling, then samples on; stop conditions still apply. Tests use it to drive exact model outputs.
    golden_token_ids: tuple[int, ...] = ()
    # Constrained output (JSON Schema, regex, EBNF grammar, choice): runtime/structured/params.py
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        # A single stop string or a list is accepted; stored as a tuple so the params stay hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, Iterable):
            object.__setattr__(self, "stop", tuple(self.stop))
        for name in ("stop_token_ids", "golden_token_ids"):
            if isinstance(getattr(self, name), Iterable):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def num_top_logprobs(self) -> int:
        """Most likely tokens reported per generated token (0 without `logprobs`)."""
        return self.logprobs or 0

    def validate(self, vocab_size: int) -> SamplingParams:
        """Raise RequestError naming the first bad field; returns self so calls can chain."""
        if not _is_int(vocab_size) or vocab_size < 1:
            raise RequestError("vocab_size", vocab_size, "a positive int")
        _check_float("temperature", self.temperature, lambda v: v >= 0, ">= 0")
        _check_float("top_p", self.top_p, lambda v: 0 < v <= 1, "in (0, 1]")
        if self.top_k != -1:
            _check_int("top_k", self.top_k, 1, _INT32_MAX, " (or -1 for off)")
        _check_float("min_p", self.min_p, lambda v: 0 <= v <= 1, "in [0, 1]")
        _check_int("max_tokens", self.max_tokens, 1, _INT32_MAX)
        _check_int("min_tokens", self.min_tokens, 0, self.max_tokens, " (at most max_tokens)")
        for name in ("stop", "stop_token_ids", "golden_token_ids"):
            if not isinstance(getattr(self, name), tuple):
                raise RequestError(name, getattr(self, name), "a list")
        for i, text in enumerate(self.stop):
            if not isinstance(text, str) or not text:
                raise RequestError(f"stop[{i}]", text, "a non-empty string")
        for i, token in enumerate(self.stop_token_ids):
            _check_int(f"stop_token_ids[{i}]", token, 0, vocab_size - 1, " (a token id)")
        for i, token in enumerate(self.golden_token_ids):
            _check_int(f"golden_token_ids[{i}]", token, 0, vocab_size - 1, " (a token id)")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(name, getattr(self, name), "a bool")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                note = " (the number of most likely tokens to return, or None for none)"
                _check_int(name, getattr(self, name), 0, MAX_TOP_LOGPROBS, note)
        if self.seed is not None:
            _check_int("seed", self.seed, -(2**63), _MASK64, " (or None for a random seed)")
        _check_int("n", self.n, 1, _INT32_MAX)
        if self.structured_outputs is not None:
            from dsgraph.runtime.structured.params import check_structured_outputs

            check_structured_outputs(self.structured_outputs)
        return self

    def op_row(self) -> tuple[float, float, int, float]:
        """(temperature, top_p, top_k, min_p) as one row of the `sample` op's inputs."""
        return float(self.temperature), float(self.top_p), int(self.top_k), float(self.min_p)

    def completion_seeds(self) -> tuple[int, ...]:
        """One int64 seed per completion: derived from `seed`, or from a fresh random one if it is None."""
        base = secrets.randbits(64) if self.seed is None else self.seed
        return tuple(completion_seed(base, i) for i in range(self.n))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingParams:
        """Build from a dict (a request body); an unknown key is a RequestError naming it."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise RequestError(key, values[key], f"one of the fields {sorted(known)} (unknown field)")
        return cls(**values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int, high: int, note: str = "") -> None:
    if not _is_int(value):
        raise RequestError(name, value, f"an int in {low}..{high}{note}")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise RequestError(name, value, f"in {low}..{high}{note}")


def _check_float(name: str, value: object, ok: Callable[[float], bool], expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(name, value, f"a number {expected}")
    if not math.isfinite(value) or not ok(value):
        raise RequestError(name, value, expected)


def seed_to_i64(seed: int) -> int:
    """A seed in [-2**63, 2**64) as the int64 the `sample` op takes (same low 64 bits)."""
    bits = seed & _MASK64
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def completion_seed(seed: int, index: int) -> int:
    """The int64 seed of completion `index` of a request: completion 0 uses `seed` itself, so n = 1
    matches a plain request; others use the SplitMix64 finaliser of (seed, index), far from every
    stream `seed` itself draws (ops/sampling.py)."""
    if index == 0:
        return seed_to_i64(seed)
    z = (seed ^ (index * 0xD1B54A32D192ED03)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return seed_to_i64(z ^ (z >> 31))
