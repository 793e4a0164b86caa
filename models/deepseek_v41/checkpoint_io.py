"""Write and load checkpoints in the released safetensors layout (spec model-v41 section 8).

On disk: `model-0000k-of-0000n.safetensors` shards, `model.safetensors.index.json` (weight_map and
total_size) and `config.json`. The loader checks every tensor against `expected_tensors` from the shard
headers before reading any payload, and reports all problems in one `CheckpointError`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
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
FINITE_CHECK_BYTES = 2 << 30  # checkpoints up to this size are checked for NaN/inf weights by default

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
    model_dir: str | Path,
    cfg: ModelConfig,
    *,
    weights: Weights = "stored",
    progress: bool = True,
    check_finite: bool | None = None,
    expected: dict[str, TensorSpec] | None = None,
    skipped: Callable[[str], bool] = is_vision_tensor,
) -> dict[str, Tensor]:
    """Load and check a checkpoint directory.

    "stored" returns every tensor as stored (quantized weights with their `.scale` companions);
    "bf16"/"f32" dequantize FP8 blocks, FP4 rows and FP8 rows into that dtype and drop the scales;
    "f32" also upcasts the plain BF16 tensors (lossless), "bf16" keeps plain tensors as stored (the FP32
    ones are FP32 by design). Vision tensors are skipped. `check_finite` checks that every floating
    tensor is finite (CheckpointError naming the first that is not); None: only for checkpoints up to
    FINITE_CHECK_BYTES, where the pass costs little. `expected` (default: V4.1's `expected_tensors(cfg)`)
    and `skipped` (tensors not read, default the vision tensors) let another model reuse the loader.
    """
    if weights not in ("stored", "bf16", "f32"):
        raise ValueError(f"weights: {weights!r} is not one of ('stored', 'bf16', 'f32')")
    root = Path(model_dir)
    weight_map = _weight_map(root, skipped)
    expected = expected_tensors(cfg) if expected is None else expected
    headers, problems = _read_headers(root, weight_map, skipped)
    problems += _compare(expected, headers)
    if problems:
        raise CheckpointError(root, problems)
    show = progress and sys.stderr.isatty()
    stored = _read_tensors(root, weight_map, expected, show)
    if check_finite or check_finite is None and _nbytes(stored) <= FINITE_CHECK_BYTES:
        _check_finite(root, stored, weight_map)
    if weights == "stored":
        return stored
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    return _dequantize(stored, expected, weights, block)


def _weight_map(root: Path, skipped: Callable[[str], bool] = is_vision_tensor) -> dict[str, str]:
    index = root / INDEX_NAME
    if index.is_file():
        try:
            data = json.loads(index.read_text())
        except ValueError as exc:  # malformed JSON or not UTF-8
            raise CheckpointError(root, [f"{INDEX_NAME}: not valid JSON: {exc}"]) from exc
        if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
            raise CheckpointError(root, [f"{INDEX_NAME}: no 'weight_map' object"])
        bad = [k for k, v in data["weight_map"].items() if not isinstance(v, str) or Path(v).name != v]
        if bad:
            raise CheckpointError(
                root,
                [
                    f"{INDEX_NAME}: tensor {k}: shard name {data['weight_map'][k]!r} "
                    "is not a file name in the checkpoint directory"
                    for k in bad
                ],
            )
        return {k: v for k, v in data["weight_map"].items() if not skipped(k)}
    if (root / _SINGLE_NAME).is_file():
        keys, problem = _shard_keys(root, _SINGLE_NAME)
        if problem:
            raise CheckpointError(root, [problem])
        return {k: _SINGLE_NAME for k in keys if not skipped(k)}
    raise CheckpointError(root, [f"neither {INDEX_NAME} nor {_SINGLE_NAME} exists"])


def _shard_keys(root: Path, file: str) -> tuple[list[str], str | None]:
    """A shard's tensor names, or the problem that its header cannot be read."""
    try:
        with safe_open(str(root / file), framework="pt") as f:
            return list(f.keys()), None
    except Exception as exc:  # safetensors raises its own SafetensorError (and OSError) for a bad file
        return [], f"shard {file}: cannot read its safetensors header: {exc}"


def _read_headers(
    root: Path, weight_map: dict[str, str], skipped: Callable[[str], bool] = is_vision_tensor
) -> tuple[dict[str, tuple[tuple[int, ...], str]], list[str]]:
    """name -> (shape, dtype) from the shard headers (no payload read)."""
    headers: dict[str, tuple[tuple[int, ...], str]] = {}
    problems: list[str] = []
    for file in sorted(set(weight_map.values())):
        if not (root / file).is_file():
            problems.append(f"shard {file} (listed in {INDEX_NAME}) does not exist")
            continue
        try:
            problems += _shard_header(root, file, weight_map, headers, skipped)
        except Exception as exc:  # a header that lists a tensor it cannot describe
            problems.append(f"shard {file}: cannot read its safetensors header: {exc}")
    return headers, problems


def _shard_header(
    root: Path,
    file: str,
    weight_map: dict[str, str],
    headers: dict[str, tuple[tuple[int, ...], str]],
    skipped: Callable[[str], bool] = is_vision_tensor,
) -> list[str]:
    problems = []
    listed = {n for n, s in weight_map.items() if s == file}
    size = (root / file).stat().st_size
    with safe_open(str(root / file), framework="pt") as f:
        present = set(f.keys())
        for name in sorted(listed):
            if name not in present:
                problems.append(f"tensor {name}: listed in {file} by {INDEX_NAME} but absent from that shard")
                continue
            sl = f.get_slice(name)
            headers[name] = (tuple(sl.get_shape()), sl.get_dtype())
        for name in sorted(present - listed):
            if not skipped(name) and weight_map.get(name) != file:
                problems.append(f"tensor {name}: in shard {file} but not listed there by {INDEX_NAME}")
    end = _data_end(root / file)
    if end is not None and end > size:
        problems.append(f"shard {file}: truncated: its header needs {end} bytes, the file has {size}")
    return problems


def _data_end(path: Path) -> int | None:
    """The byte where a shard's tensor data ends according to its header (None if unreadable)."""
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return None
        n = int.from_bytes(head, "little")
        try:
            meta = json.loads(fh.read(n))
        except ValueError:
            return None
    ends = [v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__" and "data_offsets" in v]
    return 8 + n + max(ends, default=0)


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
                    try:
                        out[name] = f.get_tensor(name)
                    except Exception as exc:  # SafetensorError: the payload cannot be read
                        raise CheckpointError(root, [f"shard {file}: tensor {name}: {exc}"]) from exc
                    bar.update(1)
    return {name: out[name] for name in expected}


def _nbytes(tensors: dict[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _check_finite(root: Path, tensors: dict[str, Tensor], weight_map: dict[str, str]) -> None:
    """CheckpointError naming the first floating tensor (in load order) holding NaN or inf."""
    for name, t in tensors.items():
        if not t.is_floating_point():
            continue
        # float8 has no isfinite kernel: check in a wider type, a slice at a time to bound the copy
        flat = t.reshape(-1)
        for start in range(0, flat.numel(), 1 << 24):
            part = flat[start : start + (1 << 24)]
            part = part.float() if part.element_size() == 1 else part
            if not bool(torch.isfinite(part).all()):
                bad = int((~torch.isfinite(part)).nonzero()[0, 0]) + start
                raise CheckpointError(
                    root, [f"tensor {name} (in {weight_map[name]}): non-finite value at flat index {bad}"]
                )


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
