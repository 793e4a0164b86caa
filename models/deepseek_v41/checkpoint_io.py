"""Write and load checkpoints in the released safetensors layout (spec model-v41 section 8).

On disk: `model-0000k-of-0000n.safetensors` shards, `model.safetensors.index.json` (weight_map and
total_size) and `config.json`. The loader checks every tensor against `expected_tensors` from the shard
headers before reading any payload, and reports all problems in one `CheckpointError`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm import tqdm

from dsgraph.models.deepseek_v41.checkpoint_spec import (
    TensorKind,
    TensorSpec,
    expected_tensors,
    is_vision_tensor,
    scale_name,
)
from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.platform.cpu.quant import fp4_rows_dequantize, fp8_block_dequantize, fp8_rows_dequantize

__all__ = ["CheckpointError", "Weights", "load_checkpoint", "torch_dtype", "write_checkpoint"]

Weights = Literal["stored", "bf16", "f32"]
INDEX_NAME = "model.safetensors.index.json"
_SINGLE_NAME = "model.safetensors"
_SHOWN_IN_FULL = 20

_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I32": torch.int32,
    "I64": torch.int64,
}


class CheckpointError(ValueError):
    """A checkpoint does not match the config; `problems` lists every finding, one line each."""

    def __init__(self, model_dir: Path, problems: list[str]) -> None:
        shown = "\n  ".join(problems[:_SHOWN_IN_FULL])
        more = f"\n  ... and {len(problems) - _SHOWN_IN_FULL} more" if len(problems) > _SHOWN_IN_FULL else ""
        super().__init__(f"checkpoint {model_dir}: {len(problems)} problem(s):\n  {shown}{more}")
        self.problems = problems


def torch_dtype(name: str) -> torch.dtype:
    """safetensors dtype name -> torch dtype."""
    if name not in _DTYPES:
        raise ValueError(f"safetensors dtype {name!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def write_checkpoint(
    out_dir: str | Path, tensors: Mapping[str, Tensor], config: Mapping[str, Any], num_shards: int = 2
) -> Path:
    """Write `tensors` as `num_shards` safetensors shards (contiguous by name, balanced by bytes),
    the index and `config.json`. Deterministic: equal inputs give byte-identical files."""
    if num_shards < 1:
        raise ValueError(f"num_shards: {num_shards}, expected >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    total = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    shards: list[dict[str, Tensor]] = [{} for _ in range(num_shards)]
    seen = 0
    for name in names:
        t = tensors[name]
        shards[min(num_shards - 1, seen * num_shards // max(total, 1))][name] = _owning(t)
        seen += t.numel() * t.element_size()
    weight_map: dict[str, str] = {}
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file(shard, str(out / file))
        weight_map.update(dict.fromkeys(shard, file))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _owning(t: Tensor) -> Tensor:
    """A contiguous tensor that owns exactly its storage (safetensors refuses shared storage)."""
    t = t.detach()
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes:
        return t
    return t.contiguous().clone()


def load_checkpoint(
    model_dir: str | Path, cfg: ModelConfig, *, weights: Weights = "stored", progress: bool = True
) -> dict[str, Tensor]:
    """Load and check a checkpoint directory.

    "stored" returns every tensor as stored (quantized weights with their `.scale` companions);
    "bf16"/"f32" dequantize FP8 blocks, FP4 rows and FP8 rows into that dtype and drop the scales;
    "f32" also upcasts the plain BF16 tensors (lossless), "bf16" keeps plain tensors as stored (the FP32
    ones are FP32 by design). Vision tensors are skipped.
    """
    if weights not in ("stored", "bf16", "f32"):
        raise ValueError(f"weights: {weights!r} is not one of ('stored', 'bf16', 'f32')")
    root = Path(model_dir)
    weight_map = _weight_map(root)
    expected = expected_tensors(cfg)
    headers, problems = _read_headers(root, weight_map)
    problems += _compare(expected, headers)
    if problems:
        raise CheckpointError(root, problems)
    show = progress and sys.stderr.isatty()
    stored = _read_tensors(root, weight_map, expected, show)
    if weights == "stored":
        return stored
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    return _dequantize(stored, expected, weights, block)


def _weight_map(root: Path) -> dict[str, str]:
    index = root / INDEX_NAME
    if index.is_file():
        data = json.loads(index.read_text())
        if not isinstance(data.get("weight_map"), dict):
            raise CheckpointError(root, [f"{INDEX_NAME}: no 'weight_map' object"])
        return {k: v for k, v in data["weight_map"].items() if not is_vision_tensor(k)}
    if (root / _SINGLE_NAME).is_file():
        with safe_open(str(root / _SINGLE_NAME), framework="pt") as f:
            return {k: _SINGLE_NAME for k in f.keys() if not is_vision_tensor(k)}
    raise CheckpointError(root, [f"neither {INDEX_NAME} nor {_SINGLE_NAME} exists"])


def _read_headers(
    root: Path, weight_map: dict[str, str]
) -> tuple[dict[str, tuple[tuple[int, ...], str]], list[str]]:
    """name -> (shape, dtype) from the shard headers (no payload read)."""
    headers: dict[str, tuple[tuple[int, ...], str]] = {}
    problems: list[str] = []
    for file in sorted(set(weight_map.values())):
        if not (root / file).is_file():
            problems.append(f"shard {file} (listed in {INDEX_NAME}) does not exist")
            continue
        with safe_open(str(root / file), framework="pt") as f:
            present = set(f.keys())
            for name in sorted(n for n, s in weight_map.items() if s == file):
                if name not in present:
                    problems.append(
                        f"tensor {name}: listed in {file} by {INDEX_NAME} but absent from that shard"
                    )
                    continue
                sl = f.get_slice(name)
                headers[name] = (tuple(sl.get_shape()), sl.get_dtype())
    return headers, problems


def _compare(expected: dict[str, TensorSpec], found: dict[str, tuple[tuple[int, ...], str]]) -> list[str]:
    problems = []
    for name, spec in expected.items():
        if name not in found:
            problems.append(f"missing tensor {name}: expected shape {spec.shape} dtype {spec.dtype_text()}")
            continue
        shape, dtype = found[name]
        if shape != spec.shape or not spec.accepts_dtype(dtype):
            problems.append(
                f"tensor {name}: expected shape {spec.shape} dtype {spec.dtype_text()}, "
                f"found shape {shape} dtype {dtype}"
            )
    for name in sorted(set(found) - set(expected)):
        shape, dtype = found[name]
        problems.append(f"unexpected tensor {name}: found shape {shape} dtype {dtype}")
    return problems


def _read_tensors(
    root: Path, weight_map: dict[str, str], expected: dict[str, TensorSpec], show: bool
) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for name in expected:
        by_file.setdefault(weight_map[name], []).append(name)
    with tqdm(total=len(expected), desc="loading checkpoint", unit="tensor", disable=not show) as bar:
        for file, names in by_file.items():
            with safe_open(str(root / file), framework="pt") as f:
                for name in names:
                    out[name] = f.get_tensor(name)
                    bar.update(1)
    return {name: out[name] for name in expected}


def _dequantize(
    stored: dict[str, Tensor], expected: dict[str, TensorSpec], weights: Weights, block: tuple[int, int]
) -> dict[str, Tensor]:
    dtype = torch.float32 if weights == "f32" else torch.bfloat16
    out: dict[str, Tensor] = {}
    for name, spec in expected.items():
        t = stored[name]
        if spec.kind is TensorKind.SCALE:
            continue
        if spec.kind is TensorKind.PLAIN:
            out[name] = t.to(torch.float32) if weights == "f32" and t.is_floating_point() else t
            continue
        scale = stored[scale_name(name)]
        if spec.kind is TensorKind.FP4_ROWS:
            out[name] = fp4_rows_dequantize(t, scale, dtype)
        elif spec.kind is TensorKind.FP8_ROWS:
            out[name] = fp8_rows_dequantize(t, scale, dtype)
        else:
            out[name] = fp8_block_dequantize(t, scale, dtype, block=block)
    return out
