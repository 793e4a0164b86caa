"""The NeMo oracle harness itself: it loads a tiny released-format checkpoint and is causal."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nemo_automodel")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from tests.oracle import nemo_ref  # noqa: E402

tiny = pytest.importorskip("dsgraph.models.deepseek_v41.tiny")

MAX_TOKENS = 64
# The tiny vocabulary's last two ids are the image and DSpark noise tokens; prompts avoid them.
PROMPT = np.random.default_rng(3).integers(0, 254, size=40).tolist()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tiny.make_tiny(tmp_path_factory.mktemp("tiny"), seed=0))


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def test_loads_and_gives_finite_logits(tiny_dir: Path) -> None:
    model = nemo_ref.load_nemo_model(tiny_dir)
    logits = nemo_ref.nemo_logits(model, PROMPT)
    assert logits.shape == (len(PROMPT), model.config.text_config.vocab_size)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert float(logits.std()) > 0.0
    # Different prompts give different last-token logits (the model reads its input).
    assert not torch.equal(logits[-1], nemo_ref.nemo_logits(model, PROMPT[:-1] + [PROMPT[-1] ^ 1])[-1])


def test_weights_come_from_the_checkpoint(tiny_dir: Path) -> None:
    model = nemo_ref.load_nemo_model(tiny_dir)
    released: dict[str, torch.Tensor] = {}
    for file in sorted(tiny_dir.glob("*.safetensors")):
        released.update(load_file(str(file)))
    assert torch.equal(model.lm_head.weight, released["head.weight"].float())
    assert torch.equal(model.model.embed_tokens.weight, released["embed.weight"].float())
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("prefix", [1, 7, 24])
def test_prefix_logits_equal_rows_of_longer_run(tiny_dir: Path, prefix: int) -> None:
    model = nemo_ref.load_nemo_model(tiny_dir, nemo_ref.select_all_overrides(MAX_TOKENS))
    full = nemo_ref.nemo_logits(model, PROMPT)
    short = nemo_ref.nemo_logits(model, PROMPT[:prefix])
    assert _relative_error(short, full[:prefix]) <= 1e-6


def test_models_are_cached_per_directory_and_overrides(tiny_dir: Path) -> None:
    plain = nemo_ref.load_nemo_model(tiny_dir)
    assert nemo_ref.load_nemo_model(tiny_dir) is plain
    everything = nemo_ref.load_nemo_model(tiny_dir, nemo_ref.select_all_overrides(MAX_TOKENS))
    assert everything is not plain
    assert everything.config.text_config.index_topk == MAX_TOKENS
    assert everything.config.text_config.candidate_topk_blocks == MAX_TOKENS


def _copy_with_tensors(src: Path, dst: Path, edit: dict[str, torch.Tensor | None]) -> Path:
    dst.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src / name, dst / name)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    for name, value in edit.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_tensor_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    broken = _copy_with_tensors(tiny_dir, tmp_path / "missing", {"layers.0.attn_norm.weight": None})
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.0\.attn_norm\.weight'\]"):
        nemo_ref.load_nemo_model(broken)


def test_unexpected_tensor_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    extra = {"layers.0.attn.bogus.weight": torch.zeros(4)}
    broken = _copy_with_tensors(tiny_dir, tmp_path / "unexpected", extra)
    with pytest.raises(ValueError, match=r"unexpected \['model\.layers\.0\.attn\.bogus\.weight'\]"):
        nemo_ref.load_nemo_model(broken)


def test_dspark_loads_checkpoint_and_drafts_greedily(tiny_dir: Path) -> None:
    model = nemo_ref.load_nemo_model(tiny_dir)
    draft = nemo_ref.load_nemo_dspark(tiny_dir)
    released = {}
    for file in sorted(tiny_dir.glob("*.safetensors")):
        released.update(load_file(str(file)))
    assert torch.equal(
        draft.mtp[-1].confidence_head.proj.weight, released["mtp.2.confidence_head.proj.weight"].float()
    )
    logits, confidence, previous = nemo_ref.nemo_dspark(model, draft, PROMPT[:20])
    block = model.config.text_config.dspark_block_size
    assert logits.shape == (block, model.config.text_config.vocab_size) and confidence.shape == (block,)
    assert torch.isfinite(logits).all() and torch.isfinite(confidence).all()
    assert previous[0] == PROMPT[19]
    assert previous[1:] == logits[:-1].argmax(-1).tolist()


def test_dspark_slot_reads_only_its_own_previous_id(tiny_dir: Path) -> None:
    # The greedy loop in nemo_dspark relies on this: slot k's Markov term sees previous id k only.
    model = nemo_ref.load_nemo_model(tiny_dir)
    draft = nemo_ref.load_nemo_dspark(tiny_dir)
    first = [PROMPT[19], 5, 6, 7, 8]
    second = [PROMPT[19], 5, 6, 99, 8]
    a, conf_a, _ = nemo_ref.nemo_dspark(model, draft, PROMPT[:20], first)
    b, conf_b, _ = nemo_ref.nemo_dspark(model, draft, PROMPT[:20], second)
    changed = [k for k in range(5) if not torch.equal(a[k], b[k])]
    assert changed == [3]
    assert [k for k in range(5) if not torch.equal(conf_a[k], conf_b[k])] == [3]


def test_dspark_rejects_previous_ids_not_starting_at_anchor(tiny_dir: Path) -> None:
    model = nemo_ref.load_nemo_model(tiny_dir)
    draft = nemo_ref.load_nemo_dspark(tiny_dir)
    with pytest.raises(ValueError, match="starting with the anchor"):
        nemo_ref.nemo_dspark(model, draft, PROMPT[:20], [PROMPT[19] ^ 1, 5, 6, 7, 8])
