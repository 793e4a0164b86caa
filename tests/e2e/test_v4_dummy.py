"""load_format="dummy" for DeepSeek-V4: random weights from config.json alone, through the model family
(`ModelFamily.dummy_weights`), of the layout a checkpoint load gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from dsgraph import LLM, SamplingParams
from dsgraph.models.deepseek_v4.tiny import make_tiny
from dsgraph.models.interface import REFERENCE, SERVING
from dsgraph.models.registry import family_for

GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(make_tiny(tmp_path_factory.mktemp("v4-dummy") / "tiny-v4", seed=0))


def _layout(weights: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}


@pytest.mark.parametrize("num", [SERVING, REFERENCE], ids=["serving", "reference"])
def test_v4_dummy_weights_have_the_checkpoints_layout(model_dir: Path, num) -> None:  # type: ignore[no-untyped-def]
    family = family_for(model_dir)
    assert family.model_type == "deepseek_v4"
    cfg = family.load_config(model_dir)
    tok = family.load_tokenizer(model_dir, cfg)
    loaded = family.load_weights(model_dir, cfg, tok, num, False)
    dummy = family.dummy_weights(cfg, tok, num, "cpu", 1)
    assert _layout(dummy) == _layout(loaded)
    assert not torch.equal(dummy["embed.weight"].float(), loaded["embed.weight"].float())  # random


def test_a_v4_config_alone_serves_with_dummy_weights(model_dir: Path, tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(model_dir / name, tmp_path / name)
    llm = LLM(tmp_path, max_model_len=64, max_num_seqs=1, load_format="dummy")
    assert llm.engine.model.cfg.model_type == "deepseek_v4"
    out = llm.generate(["w1 W2", "w1 W2"], GREEDY)
    assert len(out[0].outputs[0].token_ids) == 3
    assert out[0].outputs[0].token_ids == out[1].outputs[0].token_ids
