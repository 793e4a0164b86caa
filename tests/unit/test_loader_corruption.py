"""A damaged checkpoint directory gives an error naming the file (and the tensor where there is one):
truncated shards, flipped header bytes, dtype and shape changes, missing files, a bad index, config.json
or tokenizer.json, tensors the index does not list, NaN weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsgraph.models.deepseek_v41.checkpoint_io import INDEX_NAME, CheckpointError, load_checkpoint
from dsgraph.models.deepseek_v41.config import ConfigError, load_config
from dsgraph.models.deepseek_v41.engram_map import load_tokenizer
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return Path(shutil.copytree(default_model_dir(), tmp_path / "ckpt"))


def _load(root: Path, **kw: object) -> None:
    load_checkpoint(root, load_config(root), progress=False, **kw)  # type: ignore[arg-type]


def _header_len(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[:8], "little")


def test_the_intact_copy_loads(ckpt: Path) -> None:
    _load(ckpt, check_finite=True)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_a_truncated_shard_names_the_shard(ckpt: Path, keep: float) -> None:
    path = ckpt / SHARD
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=SHARD):
        _load(ckpt)


def test_a_shard_cut_inside_its_header_names_the_shard(ckpt: Path) -> None:
    path = ckpt / SHARD
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(CheckpointError, match=f"shard {SHARD}: cannot read its safetensors header"):
        _load(ckpt)


@pytest.mark.parametrize("offset", [0, 3, 9, 20])
def test_flipped_header_bytes_name_the_shard(ckpt: Path, offset: int) -> None:
    path = ckpt / SHARD
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=SHARD):
        _load(ckpt)


def _rewrite_header(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    data = path.read_bytes()
    n = _header_len(path)
    header = json.loads(data[8 : 8 + n])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * max(0, n - len(text))
    assert len(text) == n, "the edit must not grow the header"
    path.write_bytes(data[:8] + text + data[8 + n :])


def _first_tensor(path: Path) -> str:
    header = json.loads(path.read_bytes()[8 : 8 + _header_len(path)])
    return sorted(k for k in header if k != "__metadata__")[0]


def test_offsets_past_the_end_name_the_shard(ckpt: Path) -> None:
    path = ckpt / SHARD
    name = _first_tensor(path)

    def edit(h: dict) -> None:  # type: ignore[type-arg]
        start, end = h[name]["data_offsets"]
        h[name]["data_offsets"] = [start + 10**7, end + 10**7]

    _rewrite_header(path, edit)
    with pytest.raises(CheckpointError, match=SHARD):
        _load(ckpt)


def test_an_unknown_dtype_names_the_shard(ckpt: Path) -> None:
    path = ckpt / SHARD
    name = _first_tensor(path)
    _rewrite_header(path, lambda h: h[name].update(dtype="Q9"))
    with pytest.raises(CheckpointError, match=SHARD):
        _load(ckpt)


@pytest.mark.parametrize("change", ["dtype", "shape"])
def test_dtype_and_shape_changes_name_the_tensor(ckpt: Path, change: str) -> None:
    path = ckpt / SHARD
    tensors = load_file(str(path))
    name = sorted(n for n, t in tensors.items() if t.dtype == torch.float32 and t.dim() == 2)[0]
    t = tensors[name]
    tensors[name] = t.to(torch.float16) if change == "dtype" else t[:, :-1].contiguous()
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=f"tensor {name}: expected shape"):
        _load(ckpt)


def test_a_missing_shard_is_named(ckpt: Path) -> None:
    (ckpt / SHARD).unlink()
    with pytest.raises(CheckpointError, match=f"shard {SHARD} .*does not exist"):
        _load(ckpt)


def test_a_tensor_in_a_shard_but_not_in_the_index_is_reported(ckpt: Path) -> None:
    path = ckpt / SHARD
    tensors = load_file(str(path))
    tensors["model.stray.weight"] = torch.zeros(2)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=f"tensor model.stray.weight: in shard {SHARD} but not listed"):
        _load(ckpt)


@pytest.mark.parametrize("text", ["{not json", '{"metadata": {}}', '{"weight_map": {"a": "../x"}}'])
def test_a_bad_index_is_named(ckpt: Path, text: str) -> None:
    (ckpt / INDEX_NAME).write_text(text)
    with pytest.raises(CheckpointError, match=INDEX_NAME):
        _load(ckpt)


def test_a_bad_config_names_the_file(ckpt: Path) -> None:
    (ckpt / "config.json").write_text('{"text_config": ')
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        load_config(ckpt)


def test_an_invalid_config_value_names_the_file_and_field(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["text_config"]["vocab_size"] = "many"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config\.json: .*vocab_size"):
        load_config(ckpt)


def test_an_invalid_tokenizer_names_the_file(ckpt: Path) -> None:
    (ckpt / "tokenizer.json").write_text("{1: 2}")
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a valid tokenizer\.json"):
        load_tokenizer(ckpt, 256)
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a valid tokenizer\.json"):
        recipe_tokenizer(ckpt, 256)


def test_a_missing_tokenizer_is_an_error_when_the_packaged_one_does_not_fit(ckpt: Path) -> None:
    (ckpt / "tokenizer.json").unlink()
    vocab = load_config(ckpt).text.vocab_size
    with pytest.raises(FileNotFoundError, match=rf"tokenizer\.json does not exist.*vocab_size {vocab}"):
        load_tokenizer(ckpt, vocab)


def test_nan_weights_name_the_tensor(ckpt: Path) -> None:
    path = ckpt / SHARD
    tensors = load_file(str(path))
    name = sorted(n for n, t in tensors.items() if t.dtype in (torch.float32, torch.bfloat16))[0]
    tensors[name].reshape(-1)[3] = float("nan")
    save_file(tensors, str(path))
    with pytest.raises(
        CheckpointError, match=rf"tensor {name} \(in {SHARD}\): non-finite value at flat index 3"
    ):
        _load(ckpt)  # small checkpoints are checked by default
    _load(ckpt, check_finite=False)  # the check is the only thing that refuses it
