"""Codecs and checkpoint layout against NeMo AutoModel's independent V4.1 implementation (bit for bit)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("nemo_automodel")
pytest.importorskip("transformers")

from nemo_automodel.components.models.deepseek_v41.quantization import quantize_cache  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.state_dict_adapter import (  # noqa: E402
    dequantize_checkpoint_weight,
)

from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint  # noqa: E402
from dsgraph.models.deepseek_v41.config import load_config  # noqa: E402
from dsgraph.models.deepseek_v41.tiny import make_tiny  # noqa: E402
from dsgraph.platform.cpu import quant as q  # noqa: E402
from tests.oracle.nemo_ref import CPU_BACKEND, nemo_comparable  # noqa: E402

CACHE_CODECS = [("fp8", 32, q.fp8_g32_qdq), ("mxfp4", 32, q.mxfp4_g32_qdq), ("nvfp4", 16, q.nvfp4_g16_qdq)]
E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x.view(torch.int16)


def _random_rows(width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(width)
    magnitudes = torch.logspace(-38, 38, 40)
    return torch.randn(40, width, generator=gen) * magnitudes[:, None]


def _adversarial_rows(group: int, fmt: str) -> torch.Tensor:
    """Zeros, -0, tiny/subnormal, huge, amax at and near qmax * 2^k, values at exact rounding midpoints."""
    rows = [
        torch.zeros(group),
        torch.full((group,), -0.0),
        torch.full((group,), 1e-40),
        torch.full((group,), -3e38),
        torch.linspace(-1e-30, 1e-30, group),
    ]
    qmax = 448.0 if fmt == "fp8" else 6.0
    for k in (-20, -3, 0, 5):
        amax = torch.tensor(qmax * 2.0**k)
        nudged = [amax * (1 + j * 2.0**-22) for j in (1, 2, 3, 5)]  # amax / qmax just above 2^k
        for a in [
            amax,
            torch.nextafter(amax, torch.tensor(0.0)),
            torch.nextafter(amax, torch.tensor(1e30)),
            *nudged,
        ]:
            rows.append(torch.linspace(-1, 1, group) * a)
    if fmt == "fp8":  # midpoints between neighbouring E4M3 values at scale 1 (amax 448)
        grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        mids = (grid[:-1] + grid[1:]) / 2
        for start in range(0, len(mids) - group + 2, group - 1):
            rows.append(torch.cat((torch.tensor([448.0]), mids[start : start + group - 1])))
    else:  # E2M1 midpoints at a scale the group's amax (6 * scale) makes exact
        for scale in (1.0, 0.029296875, 2.0**-9, 0.875, 0.3125):
            row = torch.cat((torch.tensor([6.0]), E2M1_MIDPOINTS, -E2M1_MIDPOINTS)) * scale
            rows.append(torch.cat((row, torch.zeros(group - len(row)))) if group > len(row) else row[:group])
    return torch.stack([r[:group] for r in rows])


@pytest.mark.parametrize(("fmt", "group", "mine"), CACHE_CODECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_qdq_bitwise_equal_to_nemo(
    fmt: str, group: int, mine: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype
) -> None:
    for x in (_random_rows(512), _random_rows(128), _adversarial_rows(group, fmt)):
        x = nemo_comparable(x.to(dtype), fmt, group)
        ours, theirs = mine(x), quantize_cache(x, format=fmt, block_size=group)
        assert ours.dtype == theirs.dtype == dtype
        equal = _bits(ours) == _bits(theirs)
        assert bool(equal.all()), f"{fmt}: first differing input {x[~equal][:4].tolist()}"


def _raw_fp8(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Every E4M3 bit pattern except NaN (0x7F / 0xFF)."""
    raw = torch.randint(0, 255, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0
    return raw.view(torch.float8_e4m3fn)


def _raw_scale(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, 150, shape, generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 96), (40, 70), (33, 32)])
def test_fp8_block_dequantize_equals_nemo(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    weight = _raw_fp8(shape, 1)
    scale = _raw_scale((-(-shape[0] // 32), -(-shape[1] // 32)), 2)
    ours = q.fp8_block_dequantize(weight, scale, dtype)
    assert torch.equal(_bits(ours), _bits(dequantize_checkpoint_weight(weight, scale, dtype=dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp4_and_fp8_rows_dequantize_equal_nemo(dtype: torch.dtype) -> None:
    packed = torch.randint(-128, 128, (48, 64), generator=torch.Generator().manual_seed(3), dtype=torch.int8)
    scale = _raw_scale((48, 4), 4)
    ours = q.fp4_rows_dequantize(packed, scale, dtype)
    assert torch.equal(_bits(ours), _bits(dequantize_checkpoint_weight(packed, scale, dtype=dtype)))
    table, tscale = _raw_fp8((50, 64), 5), _raw_scale((50, 2), 6)
    ours = q.fp8_rows_dequantize(table, tscale, dtype)
    theirs = dequantize_checkpoint_weight(table, tscale, dtype=dtype, rowwise=True)
    assert torch.equal(_bits(ours), _bits(theirs))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny_oracle"), seed=3)


def _nemo_models(model_dir: Path) -> tuple[Any, Any]:
    """NeMo's backbone and DSpark draft built from the checkpoint's config.json (CPU backend)."""
    from nemo_automodel.components.models.common import BackendConfig
    from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41Config
    from nemo_automodel.components.models.deepseek_v41.dspark import DeepseekV41DSparkModel
    from nemo_automodel.components.models.deepseek_v41.model import DeepseekV41ForCausalLM
    from transformers import PreTrainedTokenizerFast

    raw = json.loads((model_dir / "config.json").read_text())
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(model_dir / "tokenizer.json"),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
    )
    cfg = DeepseekV41Config(
        text_config=raw["text_config"], vision_config=raw["vision_config"], dtype="float32"
    )
    backend = BackendConfig(**CPU_BACKEND)
    model = DeepseekV41ForCausalLM(cfg, backend=backend, tokenizer=tok)
    draft = DeepseekV41DSparkModel(cfg.text_config, num_anchors=2, enable_confidence_head=True)
    return model, draft


def test_tiny_checkpoint_loads_into_nemo(tiny_dir: Path) -> None:
    model, draft = _nemo_models(tiny_dir)
    cfg = load_config(tiny_dir)
    stored = load_checkpoint(tiny_dir, cfg, progress=False)
    native = model.state_dict_adapter.from_hf(dict(stored))
    missing, unexpected = model.load_state_dict(native, strict=True)
    assert (missing, unexpected) == ([], [])
    draft_native = draft.state_dict_adapter.from_hf(dict(stored))
    missing, unexpected = draft.load_state_dict(draft_native, strict=True)
    assert (missing, unexpected) == ([], [])
    # NeMo's adapter dequantizes to BF16; our loader's BF16 weights must be the same bits.
    ours = load_checkpoint(tiny_dir, cfg, weights="bf16", progress=False)
    checked = 0
    for name in ("attn.wq_a", "attn.wo_a", "attn.indexer.wq_b", "engram.embed", "engram.wkv"):
        for layer in range(cfg.text.num_hidden_layers):
            key = f"layers.{layer}.{name}.weight"
            if key in ours:
                assert torch.equal(_bits(native[f"model.{key}"]), _bits(ours[key])), key
                checked += 1
    assert torch.equal(_bits(draft_native["mtp.0.main_proj.weight"]), _bits(ours["mtp.0.main_proj.weight"]))
    assert checked == 6 * 2 + 3 + 2 * 2  # wq_a, wo_a on 6 layers; indexer on 3; engram on 2
