"""DeepSeek-V4: config validation, the checkpoint loader's errors, weight preparation, the window
compressor's state across steps, and what `serving` numerics change against `reference`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors, is_skipped
from dsgraph.models.deepseek_v4.config import ConfigError, load_config, parse_config
from dsgraph.models.deepseek_v4.layers import Attn, layer_plans
from dsgraph.models.deepseek_v4.model import build_model
from dsgraph.models.deepseek_v4.tiny import make_tiny, tiny_config_dict
from dsgraph.models.deepseek_v4.weights import prepare_weights
from dsgraph.models.deepseek_v41.checkpoint_io import CheckpointError, load_checkpoint
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.models.registry import family_for
from dsgraph.platform.cpu.quant import fp8_block_dequantize
from dsgraph.runtime.step_runner import StepRunner


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("v4") / "tiny", seed=4)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"compress_ratios": [0, 4, 3, 4, 0]}, "compress_ratios[2]"),
        ({"layer_types": ["sliding_attention", "dense"] + ["sliding_attention"] * 3}, "layer_types[1]"),
        ({"mlp_layer_types": ["moe", "hash_moe", "moe", "moe", "moe"]}, "mlp_layer_types[1]"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"hidden_size": "64"}, "hidden_size"),
        ({"eos_token_id": 999}, "eos_token_id"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2}}, "rope_scaling.rope_type"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"model_type": "deepseek_v41"}, "model_type"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ],
)
def test_config_errors_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(tiny_config_dict(**change))
    assert err.value.path == field


def test_transformers_and_release_names_give_one_config() -> None:
    names = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    hf = {k: v for k, v in tiny_config_dict().items() if k not in ("compress_ratios", "num_hash_layers")}
    hf.update(
        layer_types=[names[i] for i in (0, 1, 2, 1, 0)],
        mlp_layer_types=["hash_moe"] + ["moe"] * 4,
        partial_rotary_factor=0.25,
    )
    hf.pop("qk_rope_head_dim")
    assert parse_config(hf) == parse_config(tiny_config_dict())
    kinds = [p.attn for p in layer_plans(parse_config(hf).text)]
    assert kinds == [Attn.SWA, Attn.CSA, Attn.HCA, Attn.CSA, Attn.SWA]


def test_registry_picks_the_family_by_model_type(model_dir: Path) -> None:
    assert family_for(model_dir).model_type == "deepseek_v4"
    bad = model_dir.parent / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="'llama' is not one of"):
        family_for(bad)


def test_loader_names_a_missing_and_a_misshaped_tensor(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    broken = Path(shutil.copytree(model_dir, tmp_path / "broken"))
    shard = sorted(broken.glob("model-*.safetensors"))[0]
    tensors = load_file(str(shard))
    name = sorted(tensors)[0]
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    victim = next(k for k in sorted(tensors) if k != name)
    del tensors[victim], index["weight_map"][victim]
    tensors[name] = torch.zeros(3, 5, dtype=tensors[name].dtype)
    save_file(tensors, str(shard))
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = load_config(broken)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(broken, cfg, expected=expected_tensors(cfg), skipped=is_skipped)
    text = str(err.value)
    assert f"missing tensor {victim}" in text and f"tensor {name}: expected shape" in text


def test_serving_keeps_fp8_with_32_blocks_of_the_same_values(model_dir: Path) -> None:
    cfg = load_config(model_dir)
    stored = load_checkpoint(model_dir, cfg, expected=expected_tensors(cfg), skipped=is_skipped)
    served = prepare_weights(cfg, stored, SERVING)
    name = "layers.1.attn.wq_b.weight"
    scale = name.replace("weight", "scale")
    want = fp8_block_dequantize(stored[name], stored[scale], block=(128, 128))
    assert torch.equal(fp8_block_dequantize(served[name], served[scale], block=(32, 32)), want)
    bias = served["layers.0.ffn.gate.hash_bias"]
    assert torch.equal((bias > 0).nonzero()[:, 1].view(-1, 2), stored["layers.0.ffn.gate.tid2eid"].sort(1)[0])


def _logits(model_dir: Path, num, chunks: list[int], ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    cfg = load_config(model_dir)
    stored = load_checkpoint(model_dir, cfg, expected=expected_tensors(cfg), skipped=is_skipped)
    model = build_model(cfg, num, default_geometry(cfg.text, 256, page_size=8))
    runner = StepRunner(model, prepare_weights(cfg, stored, num), num_slots=2, num_pages=16)
    runner.add(0)
    out, start = [], 0
    for n in chunks:
        out.append(runner.step([(0, ids[start : start + n])])[0])
        start += n
    return torch.log_softmax(torch.cat(out).float(), dim=-1)


IDS = [3 + (i * 37) % 250 for i in range(40)]


def test_chunking_does_not_change_a_single_bit(model_dir: Path) -> None:
    """Window state carried across steps (HCA windows of 16 split by chunks of 5, 7, 13, 15)."""
    whole = _logits(model_dir, REFERENCE, [40], IDS)
    assert torch.equal(_logits(model_dir, REFERENCE, [5, 7, 13, 15], IDS), whole)


def test_serving_numerics_change_logprobs_by_a_stated_amount(model_dir: Path) -> None:
    """docs/model-v4.md states this bound: BF16 activations and FP8 GEMM inputs on a random tiny model."""
    diff = (_logits(model_dir, SERVING, [40], IDS) - _logits(model_dir, REFERENCE, [40], IDS)).abs().max()
    assert 0.5 < float(diff) < 3.0  # 1.96 nats at most over these 40 positions


def test_the_capturable_unchecked_rules_give_the_same_bits(model_dir: Path) -> None:
    """The cuda platform captures steps with the rules' host checks off (`unchecked`): V4's compressor
    then pools a fixed number of windows, and attention gathers selected entries without nonzero()."""
    from dsgraph.platform.cpu.step_rows import unchecked

    checked = _logits(model_dir, REFERENCE, [17, 23], IDS)
    with unchecked():
        assert torch.equal(_logits(model_dir, REFERENCE, [17, 23], IDS), checked)
