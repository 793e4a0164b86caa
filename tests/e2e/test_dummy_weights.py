"""load_format="dummy": random weights from config.json alone, of the shapes and dtypes a checkpoint
load gives, on the platform's device."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from dsgraph import LLM, SamplingParams
from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint
from dsgraph.models.deepseek_v41.config import load_config
from dsgraph.models.deepseek_v41.dummy_weights import dummy_weights
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING
from dsgraph.models.deepseek_v41.weights import prepare_weights
from tests.oracle import model_fixtures as fx

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def config_only(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config-only")
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(Path(model_dir) / name, root / name)
    return root


def _layout(weights: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}


@pytest.mark.parametrize("num", [SERVING, REFERENCE], ids=["serving", "reference"])
def test_dummy_weights_have_the_checkpoints_layout(model_dir: str, num) -> None:  # type: ignore[no-untyped-def]
    cfg = load_config(model_dir)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    loaded = prepare_weights(cfg, load_checkpoint(model_dir, cfg, progress=False), num, token_map)
    dummy = dummy_weights(cfg, num, token_map, device="cpu")
    want = _layout(loaded)
    if (
        num is SERVING
    ):  # the release's head is BF16 (the dummy's); the tiny checkpoint's random F32 head stays F32
        want["head.weight"] = (want["head.weight"][0], torch.bfloat16)
    assert _layout(dummy) == want
    assert torch.equal(dummy["engram.token_map"], loaded["engram.token_map"])
    assert not torch.equal(dummy["embed.weight"].float(), loaded["embed.weight"].float())  # random, not read


def test_a_config_alone_serves_with_dummy_weights(config_only: Path) -> None:
    with pytest.raises(Exception, match="safetensors|checkpoint"):
        LLM(config_only, max_model_len=128)  # no weights on disk: the default load format needs them
    outs = [
        LLM(config_only, max_model_len=128, load_format="dummy").generate("w1 W2", GREEDY)[0] for _ in "ab"
    ]
    assert (
        len(outs[0].outputs[0].token_ids) == 4
        and outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    )
    with pytest.raises(
        ValueError,
        match=r"EngineConfig.load.format = 'random' \(option load_format\): expected one of 'auto', 'dummy'",
    ):
        LLM(config_only, load_format="random")


@pytest.mark.gpu
def test_dummy_weights_are_generated_on_the_gpu(config_only: Path) -> None:
    llm = LLM(config_only, max_model_len=128, load_format="dummy", platform="cuda")
    assert all(t.is_cuda for t in llm.engine.session.weights.values() if t.numel() > 1 << 20)
    assert len(llm.generate("w1 W2", GREEDY)[0].outputs[0].token_ids) == 4
