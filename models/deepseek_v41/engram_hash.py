"""Engram n-gram hashing: token ids -> table row ids (spec model-v41 4.3).

For each Engram layer L and each n-gram order n = 2..max_ngram there are `n_heads` hash heads, each
with its own prime bucket count. A token's row for (order n, head j) is

    c_s = map[id_{t-s}]  (s = 0..max_ngram-1; pad once a shift is blocked, and for all larger s)
    h_n = (c_0*m_0) xor (c_1*m_1) xor ... xor (c_{n-1}*m_{n-1})          (int64)
    row = h_n mod prime[n][j] + offset[n][j]

Everything is int64 (numpy) or exact Python ints: the multipliers are ~2^46 and must never pass
through a float.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

_INT64_MAX = (1 << 63) - 1
_MULTIPLIER_SEED_STRIDE = 10007


@dataclass(frozen=True, slots=True)
class EngramSpec:
    """The text-config integers Engram hashing depends on.

    Fields mirror `text_config`: layer_ids = engram_layer_ids, vocab_size = engram_vocab_size
    (primes start above vocab_size - 1), n_heads = engram_n_heads, max_ngram =
    engram_max_ngram_size, compressed_vocab = engram_compressed_vocab_size, num_embeddings =
    engram_num_embeddings (rows per layer table), pad_token_id = engram_pad_token_id (a raw id).
    """

    layer_ids: tuple[int, ...]
    vocab_size: int
    n_heads: int
    max_ngram: int
    compressed_vocab: int
    num_embeddings: tuple[int, ...]
    pad_token_id: int = 2

    def __post_init__(self) -> None:
        # Tuples keep the spec hashable (engram_primes is cached per spec) even if lists are passed.
        object.__setattr__(self, "layer_ids", tuple(int(v) for v in self.layer_ids))
        object.__setattr__(self, "num_embeddings", tuple(int(v) for v in self.num_embeddings))
        if not self.layer_ids or len(set(self.layer_ids)) != len(self.layer_ids):
            raise ValueError(f"engram_layer_ids must be non-empty and distinct, got {self.layer_ids}")
        if len(self.num_embeddings) != len(self.layer_ids):
            raise ValueError(
                f"engram_num_embeddings has {len(self.num_embeddings)} entries, "
                f"expected one per engram layer ({len(self.layer_ids)})"
            )
        for name, value, low in (
            ("engram_vocab_size", self.vocab_size, 2),
            ("engram_n_heads", self.n_heads, 1),
            ("engram_max_ngram_size", self.max_ngram, 2),
            ("engram_compressed_vocab_size", self.compressed_vocab, 1),
        ):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")

    @property
    def num_orders(self) -> int:
        """N-gram orders 2..max_ngram."""
        return self.max_ngram - 1

    @property
    def rows_per_token(self) -> int:
        """Row ids looked up per token per table (orders * heads)."""
        return self.num_orders * self.n_heads

    @classmethod
    def from_dict(cls, text_config: Mapping[str, Any]) -> EngramSpec:
        """Build from a `text_config` mapping (config.json's nested dict)."""
        return cls(
            layer_ids=tuple(int(v) for v in text_config["engram_layer_ids"]),
            vocab_size=int(text_config["engram_vocab_size"]),
            n_heads=int(text_config["engram_n_heads"]),
            max_ngram=int(text_config["engram_max_ngram_size"]),
            compressed_vocab=int(text_config["engram_compressed_vocab_size"]),
            num_embeddings=tuple(int(v) for v in text_config["engram_num_embeddings"]),
            pad_token_id=int(text_config.get("engram_pad_token_id", 2)),
        )

    @classmethod
    def from_text_config(cls, text_config: object) -> EngramSpec:
        """Build from any object with the `engram_*` attributes of text_config (e.g. `TextConfig`)."""
        names = (
            "engram_layer_ids",
            "engram_vocab_size",
            "engram_n_heads",
            "engram_max_ngram_size",
            "engram_compressed_vocab_size",
            "engram_num_embeddings",
            "engram_pad_token_id",
        )
        missing = [n for n in names if not hasattr(text_config, n)]
        if missing:
            raise ValueError(f"{type(text_config).__name__} lacks Engram fields {missing}")
        return cls.from_dict({n: getattr(text_config, n) for n in names})


@dataclass(frozen=True, slots=True)
class EngramLayerHash:
    """Hash constants of one Engram layer; primes/offsets are [orders][heads], order 2 first."""

    layer_id: int
    primes: tuple[tuple[int, ...], ...]
    offsets: tuple[tuple[int, ...], ...]
    multipliers: tuple[int, ...]

    @property
    def num_rows(self) -> int:
        """Rows of this layer's table (sum of its primes)."""
        return sum(sum(order) for order in self.primes)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def _next_unused_prime(after: int, used: set[int]) -> int:
    candidate = after + 1
    while not (_is_prime(candidate) and candidate not in used):
        candidate += 1
    return candidate


def engram_multipliers(layer_id: int, max_ngram: int, compressed_vocab: int) -> tuple[int, ...]:
    """Odd multipliers m_s = 2 r_s + 1 seeded by the layer id (bound keeps c_s * m_s < 2^63)."""
    bound = max(1, _INT64_MAX // compressed_vocab // 2)
    rng = np.random.default_rng(_MULTIPLIER_SEED_STRIDE * layer_id)
    draws = rng.integers(0, bound, size=max_ngram, dtype=np.int64)
    return tuple(2 * int(r) + 1 for r in draws)


@lru_cache(maxsize=16)
def engram_primes(spec: EngramSpec) -> tuple[EngramLayerHash, ...]:
    """Hash constants of every Engram layer, in `spec.layer_ids` order.

    Every (order, head) of every layer restarts its search at `vocab_size - 1` and takes the next
    prime not used anywhere before, so all buckets of all layers have distinct primes.
    """
    used: set[int] = set()
    layers: list[EngramLayerHash] = []
    for layer_id, num_rows in zip(spec.layer_ids, spec.num_embeddings, strict=True):
        primes: list[tuple[int, ...]] = []
        for _order in range(spec.num_orders):
            order_primes: list[int] = []
            current = spec.vocab_size - 1
            for _head in range(spec.n_heads):
                current = _next_unused_prime(current, used)
                used.add(current)
                order_primes.append(current)
            primes.append(tuple(order_primes))
        flat = [p for order in primes for p in order]
        if sum(flat) != num_rows:
            raise ValueError(
                f"engram layer {layer_id}: engram_num_embeddings is {num_rows} but its "
                f"{len(flat)} bucket primes sum to {sum(flat)}"
            )
        starts = [sum(flat[:i]) for i in range(len(flat))]
        offsets = tuple(
            tuple(starts[o * spec.n_heads : (o + 1) * spec.n_heads]) for o in range(spec.num_orders)
        )
        multipliers = engram_multipliers(layer_id, spec.max_ngram, spec.compressed_vocab)
        layers.append(EngramLayerHash(layer_id, tuple(primes), offsets, multipliers))
    return tuple(layers)


def _window(
    token_ids: Sequence[int] | np.ndarray,
    positions: Sequence[int] | np.ndarray,
    lookback: Sequence[int | None] | None,
    blocked: Sequence[bool] | np.ndarray | None,
    history: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Raw ids [history + T] and blocked flags of the lookback tokens followed by the chunk."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    pos = np.asarray(positions, dtype=np.int64).reshape(-1)
    if pos.shape != ids.shape:
        raise ValueError(f"engram_rows: positions has {pos.size} entries, token_ids has {ids.size}")
    first = int(pos[0]) if pos.size else 0
    if first < 0 or np.any(pos != first + np.arange(pos.size)):
        raise ValueError(
            f"engram_rows: positions must be consecutive from a first position >= 0, got {pos[:8]}..."
        )
    back = [None] * history if lookback is None else list(lookback)
    if len(back) != history:
        raise ValueError(
            f"engram_rows: lookback must hold {history} token ids (oldest first), got {len(back)}"
        )
    back_ids = np.asarray([-1 if t is None else int(t) for t in back], dtype=np.int64)
    # A lookback slot before position 0 is blocked whatever the caller put there.
    back_blocked = (back_ids < 0) | (first - history + np.arange(history) < 0)
    if ids.size and int(ids.min()) < 0:
        raise ValueError(
            f"engram_rows: token_ids must be >= 0 (use blocked= for masked tokens), got {int(ids.min())}"
        )
    chunk_blocked = np.zeros(ids.shape, dtype=bool)
    if blocked is not None:
        flags = np.asarray(blocked, dtype=bool).reshape(-1)
        if flags.shape != ids.shape:
            raise ValueError(f"engram_rows: blocked has {flags.size} entries, token_ids has {ids.size}")
        chunk_blocked = chunk_blocked | flags
    return np.concatenate([back_ids, ids]), np.concatenate([back_blocked, chunk_blocked])


def engram_rows(
    token_ids: Sequence[int] | np.ndarray,
    positions: Sequence[int] | np.ndarray,
    lookback: Sequence[int | None] | None,
    token_map: Sequence[int] | np.ndarray,
    spec: EngramSpec,
    layer_k: int,
    blocked: Sequence[bool] | np.ndarray | None = None,
) -> np.ndarray:
    """Table row ids of a chunk of one request's tokens for Engram layer `spec.layer_ids[layer_k]`.

    Args:
        token_ids: raw ids of the chunk, [T].
        positions: their positions in the sequence, [T], consecutive (position 0 = sequence start).
        lookback: the `max_ngram - 1` raw ids just before the chunk, oldest first; -1 or None marks
            a blocked slot (masked/image token). Slots before position 0 are blocked regardless.
            None means all blocked (a chunk at position 0).
        token_map: raw id -> compressed id (`engram_map.build_token_map`); an int64 array avoids
            a conversion per call.
        blocked: per chunk token, True for a masked/image token. A blocked token at shift s makes
            shift s and every larger shift use pad (it is sticky), as does the sequence start.

    Returns:
        int64 [T, orders * heads], order-major (order 2 heads 0..H-1, then order 3, ...), rows of
        that layer's table (offsets included). The result only depends on each token's own window,
        so any chunking of a sequence gives the same rows as hashing it whole.
    """
    if not 0 <= layer_k < len(spec.layer_ids):
        raise ValueError(f"engram_rows: layer_k {layer_k} outside 0..{len(spec.layer_ids) - 1}")
    history = spec.max_ngram - 1
    ids, is_blocked = _window(token_ids, positions, lookback, blocked, history)
    table = _checked_token_map(token_map, spec, int(ids.max()) if ids.size else 0)
    compressed = table[ids]  # blocked slots are replaced by pad in _hash_window
    return _hash_window(
        compressed, is_blocked, int(table[spec.pad_token_id]), engram_primes(spec)[layer_k], spec
    )


def _checked_token_map(token_map: Sequence[int] | np.ndarray, spec: EngramSpec, max_id: int) -> np.ndarray:
    table = np.asarray(token_map, dtype=np.int64)
    if max_id >= table.shape[0]:
        raise ValueError(
            f"engram_rows: token id {max_id} is outside the tokenizer vocabulary [0, {table.shape[0]})"
        )
    if not 0 <= spec.pad_token_id < table.shape[0]:
        raise ValueError(
            f"engram_pad_token_id {spec.pad_token_id} is outside the token map [0, {table.shape[0]})"
        )
    if table.size and int(table.max()) >= spec.compressed_vocab:
        # A larger compressed id could overflow c * m in int64 (the multiplier bound assumes it).
        raise ValueError(
            f"token_map holds compressed id {int(table.max())} but engram_compressed_vocab_size is "
            f"{spec.compressed_vocab}"
        )
    return table


def _hash_window(
    compressed: np.ndarray, is_blocked: np.ndarray, pad: int, layer: EngramLayerHash, spec: EngramSpec
) -> np.ndarray:
    """Rows [T, orders * heads] from compressed ids and blocked flags of [history + T] slots."""
    history = spec.max_ngram - 1
    num_tokens = compressed.size - history
    multipliers = np.asarray(layer.multipliers, dtype=np.int64)
    rows = np.empty((num_tokens, spec.rows_per_token), dtype=np.int64)
    shift_blocked = np.zeros(num_tokens, dtype=bool)
    rolling = np.zeros(num_tokens, dtype=np.int64)
    for shift in range(spec.max_ngram):
        source = slice(history - shift, history - shift + num_tokens)
        shift_blocked |= is_blocked[source]
        # c * m stays below 2^63 because c < compressed_vocab and m < 2^63 / compressed_vocab.
        product = np.where(shift_blocked, pad, compressed[source]) * multipliers[shift]
        rolling = product if shift == 0 else np.bitwise_xor(rolling, product)
        if shift == 0:
            continue
        order = shift - 1
        primes = np.asarray(layer.primes[order], dtype=np.int64)
        offsets = np.asarray(layer.offsets[order], dtype=np.int64)
        cols = slice(order * spec.n_heads, (order + 1) * spec.n_heads)
        rows[:, cols] = rolling[:, None] % primes[None, :] + offsets[None, :]
    return rows


def table_rows(layer_ids: Sequence[int], vocab_size: int, n_heads: int, max_ngram: int) -> tuple[int, ...]:
    """`engram_num_embeddings` consistent with the other fields: each layer's bucket primes summed (the
    same search as `engram_primes`), for configs whose table sizes are chosen rather than released."""
    used: set[int] = set()
    rows: list[int] = []
    for _layer in layer_ids:
        total = 0
        for _order in range(max_ngram - 1):
            current = vocab_size - 1
            for _head in range(n_heads):
                current = _next_unused_prime(current, used)
                used.add(current)
                total += current
        rows.append(total)
    return tuple(rows)
