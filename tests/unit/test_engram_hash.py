"""Engram token map and n-gram hashing, device-free (spec model-v41 4.3 and 10).

Expected constants (primes, multipliers, map size) are the spec's published values; the hash itself
is checked against a direct pure-Python transcription of the spec formula, written here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from dsgraph.models.deepseek_v41.engram_hash import EngramSpec, engram_primes, engram_rows
from dsgraph.models.deepseek_v41.engram_map import build_token_map, normalize_token_text

REAL = EngramSpec(
    layer_ids=(1, 14),
    vocab_size=16_000_000,
    n_heads=8,
    max_ngram=4,
    compressed_vocab=99092,
    num_embeddings=(384006168, 384016682),
)
TINY = EngramSpec(
    layer_ids=(1, 2), vocab_size=31, n_heads=2, max_ngram=4, compressed_vocab=130, num_embeddings=(252, 410)
)


def tiny_tokenizer() -> Tokenizer:
    """The spec's fixture tokenizer: <bos>,<eos>,<pad>,w0,W0,w1,W1,... (256 ids)."""
    names = ["<bos>", "<eos>", "<pad>"]
    names += [f"{c}{i}" for i in range(127) for c in "wW"][: 256 - len(names)]
    tok = Tokenizer(models.WordLevel(vocab={n: i for i, n in enumerate(names)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


TINY_MAP, TINY_KEYS = build_token_map(tiny_tokenizer())


def test_real_config_published_multipliers_and_primes() -> None:
    layer1, layer14 = engram_primes(REAL)
    assert layer1.multipliers == (76632096046245, 4839876093313, 35959672319349, 73987337458391)
    assert layer14.multipliers == (67716810739261, 51510806800915, 30921347202721, 82619226485591)
    assert (layer1.primes[0][0], layer1.primes[-1][-1]) == (16000057, 16000463)
    assert (layer14.primes[0][0], layer14.primes[-1][-1]) == (16000477, 16000889)
    assert (layer1.num_rows, layer14.num_rows) == (384006168, 384016682)
    assert all(len(order) == 8 for layer in (layer1, layer14) for order in layer.primes)


def test_real_config_offsets_are_exclusive_cumsum() -> None:
    for layer in engram_primes(REAL):
        flat_primes = [p for order in layer.primes for p in order]
        flat_offsets = [o for order in layer.offsets for o in order]
        assert flat_offsets[0] == 0
        assert all(flat_offsets[i + 1] - flat_offsets[i] == flat_primes[i] for i in range(23))
        assert flat_offsets[-1] + flat_primes[-1] == layer.num_rows


def test_tiny_config_primes() -> None:
    layer1, layer2 = engram_primes(TINY)
    assert layer1.primes == ((31, 37), (41, 43), (47, 53))
    assert layer2.primes == ((59, 61), (67, 71), (73, 79))
    assert layer1.offsets == ((0, 31), (68, 109), (152, 199))


def test_prime_sum_mismatch_names_layer_and_both_numbers() -> None:
    bad = EngramSpec((1, 2), 31, 2, 4, 130, (252, 411))
    with pytest.raises(ValueError, match=r"layer 2.*411.*410"):
        engram_primes(bad)


def test_spec_from_dict_and_attribute_object() -> None:
    raw = {
        "engram_layer_ids": [1, 2],
        "engram_vocab_size": 31,
        "engram_n_heads": 2,
        "engram_max_ngram_size": 4,
        "engram_compressed_vocab_size": 130,
        "engram_num_embeddings": [252, 410],
        "engram_pad_token_id": 2,
    }
    assert EngramSpec.from_dict(raw) == TINY

    class Obj:
        pass

    obj = Obj()
    obj.__dict__.update(raw)
    assert EngramSpec.from_text_config(obj) == TINY


def test_tiny_token_map_matches_spec() -> None:
    assert TINY_KEYS == 130
    assert TINY_MAP[:3] == [0, 1, 2]
    assert TINY_MAP[3] == TINY_MAP[4] == 3  # w0 / W0 collide under lower-casing
    assert TINY_MAP[5] == TINY_MAP[6] == 4
    assert len(TINY_MAP) == 256 and max(TINY_MAP) == 129


@pytest.mark.parametrize(
    ("text", "raw", "key"),
    [
        ("Hello", "Hello", "hello"),
        ("  Hello\t\n", "x", "hello"),
        (" ", " ", " "),  # a lone space survives the strip
        ("\t\n ", "x", " "),  # a whitespace run collapses to one space and survives too
        ("Ünïcödé", "x", "unicode"),
        ("ﬁ", "x", "fi"),  # NFKC
        ("ab\ufffd", "RAW", "RAW"),  # partial UTF-8: raw vocabulary string
        ("\u0301", "x", "\u0301"),  # normalises to empty: decoded text kept
    ],
)
def test_normalize_token_text(text: str, raw: str, key: str) -> None:
    assert normalize_token_text(text, raw) == key


def _spec_rows(window: list[int | None], spec: EngramSpec, k: int, token_map: list[int]) -> list[int]:
    """Direct transcription of spec 4.3 for one token; window = ids at t-3..t, None = blocked."""
    layer = engram_primes(spec)[k]
    pad = token_map[spec.pad_token_id]
    c, stopped = [], False
    for s in range(spec.max_ngram):
        raw = window[len(window) - 1 - s]
        stopped = stopped or raw is None
        c.append(pad if stopped else token_map[raw])
    rows, h = [], c[0] * layer.multipliers[0]
    for n in range(2, spec.max_ngram + 1):
        h ^= c[n - 1] * layer.multipliers[n - 1]
        rows += [h % p + o for p, o in zip(layer.primes[n - 2], layer.offsets[n - 2], strict=True)]
    return rows


def _windows(ids: list[int], masked: list[bool], history: int) -> list[list[int | None]]:
    padded: list[int | None] = [None] * history + [None if m else t for t, m in zip(ids, masked, strict=True)]
    return [padded[i : i + history + 1] for i in range(len(ids))]


@pytest.mark.parametrize("k", [0, 1])
def test_rows_match_spec_formula(k: int) -> None:
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 256, size=30).tolist()
    masked = (rng.random(30) < 0.15).tolist()
    got = engram_rows(ids, list(range(30)), None, TINY_MAP, TINY, k, blocked=masked)
    want = [_spec_rows(w, TINY, k, TINY_MAP) for w in _windows(ids, masked, 3)]
    assert got.dtype == np.int64 and got.tolist() == want


def test_real_config_rows_match_spec_formula() -> None:
    # Real multipliers are ~2^46: any float on the way would change these rows.
    token_map = list(range(99092)) + [7] * 30188
    rng = np.random.default_rng(7)
    ids = rng.integers(0, len(token_map), size=16).tolist()
    for k in (0, 1):
        got = engram_rows(ids, list(range(16)), None, token_map, REAL, k)
        want = [_spec_rows(w, REAL, k, token_map) for w in _windows(ids, [False] * 16, 3)]
        assert got.tolist() == want
        assert got.min() >= 0 and got.max() < REAL.num_embeddings[k]


def test_blocked_token_is_sticky() -> None:
    # After a masked token, the row of token t equals its row at the sequence start.
    ids = [10, 20, 30, 40, 50]
    after_mask = engram_rows(
        ids, range(5), None, TINY_MAP, TINY, 0, blocked=[False, False, True, False, False]
    )
    at_start = engram_rows([40], [0], None, TINY_MAP, TINY, 0)
    assert after_mask[3].tolist() == at_start[0].tolist()
    assert after_mask[4].tolist() != at_start[0].tolist()


def test_lookback_before_sequence_start_is_ignored() -> None:
    # Position 1: only the slot at position 0 is real; the caller's other slots are ignored.
    a = engram_rows([77], [1], [99, 98, 13], TINY_MAP, TINY, 1)
    b = engram_rows([13, 77], [0, 1], None, TINY_MAP, TINY, 1)
    assert a[0].tolist() == b[1].tolist()


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 255), st.booleans()), min_size=1, max_size=40),
    cuts=st.lists(st.integers(1, 39), max_size=6),
    k=st.integers(0, 1),
)
def test_chunk_invariance(data: list[tuple[int, bool]], cuts: list[int], k: int) -> None:
    ids = [t for t, _ in data]
    masked = [m and t % 3 == 0 for t, m in data]  # a sprinkling of masked tokens
    whole = engram_rows(ids, range(len(ids)), None, TINY_MAP, TINY, k, blocked=masked)
    bounds = sorted({0, len(ids), *(c for c in cuts if c < len(ids))})
    parts = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        lookback = [None if i < 0 or masked[i] else ids[i] for i in range(start - 3, start)]
        parts.append(
            engram_rows(ids[start:end], range(start, end), lookback, TINY_MAP, TINY, k, masked[start:end])
        )
    assert np.array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"positions": [0, 2]}, "consecutive"),
        ({"lookback": [1, 2]}, "lookback must hold 3"),
        ({"token_ids": [3, 256]}, "token id 256"),
        ({"layer_k": 2}, "layer_k 2"),
        ({"blocked": [True]}, "blocked has 1"),
        ({"token_ids": [3, -1]}, "token_ids must be >= 0"),
    ],
)
def test_errors_name_the_argument(kwargs: dict, message: str) -> None:
    args = {"token_ids": [3, 4], "positions": [0, 1], "lookback": None, "layer_k": 0, "blocked": None}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        engram_rows(
            args["token_ids"],
            args["positions"],
            args["lookback"],
            TINY_MAP,
            TINY,
            args["layer_k"],
            args["blocked"],
        )


def test_token_map_too_large_for_compressed_vocab() -> None:
    with pytest.raises(ValueError, match="compressed id 200.*130"):
        engram_rows([3], [0], None, [0, 1, 2, 200], TINY, 0)


def test_spec_from_parsed_checkpoint_config() -> None:
    from dsgraph.models.deepseek_v41.config import parse_config
    from dsgraph.models.deepseek_v41.tiny import tiny_config_dict

    assert EngramSpec.from_text_config(parse_config(tiny_config_dict()).text) == TINY


def test_table_rows_agree_with_the_prime_search() -> None:
    from dsgraph.models.deepseek_v41.engram_hash import EngramSpec, engram_primes, table_rows

    # the tiny config's hand-checked sizes (spec section 10)
    assert table_rows([1, 2], 31, 2, 4) == (252, 410)
    rows = table_rows([1, 14], 1000, 8, 4)
    spec = EngramSpec((1, 14), 1000, 8, 4, 500, rows)
    assert tuple(h.num_rows for h in engram_primes(spec)) == rows
