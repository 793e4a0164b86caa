"""Random weights from a config alone (`load_format="dummy"`, vLLM's name; the benchmark's model), generated
on the device that runs them, with no checkpoint file. Serving numerics keep every tensor as stored (FP8
block-scaled matrices, packed MXFP4 experts), so the graph's weights are the stored tensors with routed
experts stacked per layer (as `models/deepseek_v41/weights.py` lays them out). Experts are generated and
quantized one at a time and stacked per layer, so the peak is one layer's experts twice. Reference
numerics dequantize: `dummy_weights` then builds the stored tensors and converts them as a loaded
checkpoint is converted."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor

from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, TensorSpec, expected_tensors, scale_name
from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.tiny import quantize_tensor, sample_weight
from dsgraph.models.deepseek_v41.weights import prepare_weights
from dsgraph.models.interface import Numerics
from dsgraph.platform.cpu.quant import fp8_rows_quantize
from dsgraph.platform.registry import host_table_min_bytes, pin_host

_EXPERT = re.compile(r"((?:layers|mtp)\.\d+\.ffn\.experts)\.(\d+)\.(w[123])\.weight")


Stored = tuple[Tensor, Tensor | None]  # a weight and its scale (None for plain tensors)


def _plain_dtype(name: str, spec: TensorSpec) -> torch.dtype:
    """The serving dtype of a plain tensor: the spec's, but the LM head has the release's BF16 values
    (numerics section 9), which the loader keeps in BF16 (weights.py `release_dtype`)."""
    return torch.bfloat16 if name == "head.weight" else torch_dtype(spec.dtype)


# FP32 values sampled at once at most. A larger FP8-rows tensor (the bench model's Engram table: 24M rows
# x 256, 23 GiB as FP32) is sampled and quantized a block of rows at a time, so its generation needs its
# stored bytes and one block on the device, not several FP32 copies of it (which no 80 GB GPU holds).
SAMPLE_ELEMENTS = 1 << 28


def _stored_rows(name: str, shape: tuple[int, ...], gen: torch.Generator) -> Stored:
    """An FP8-rows tensor sampled and quantized a block of rows at a time: the codec quantizes each row
    on its own, so every block is the codec's encoding of its sampled rows (one block when the tensor is
    at most SAMPLE_ELEMENTS: then exactly the unblocked result; on the CPU the blocks draw the values of
    one call, on a GPU torch's generator offsets make them other draws of the same distribution)."""
    rows, cols = shape
    step = max(1, SAMPLE_ELEMENTS // cols)
    values = torch.empty(shape, dtype=torch.float8_e4m3fn, device=gen.device)
    scales = torch.empty((rows, cols // 32), dtype=torch.float8_e8m0fnu, device=gen.device)
    for start in range(0, rows, step):
        q, s = fp8_rows_quantize(sample_weight(name, (min(step, rows - start), cols), gen))
        values[start : start + q.shape[0]] = q
        scales[start : start + q.shape[0]] = s
    return values, scales


def _stored(cfg: ModelConfig, name: str, spec: TensorSpec, gen: torch.Generator) -> Stored:
    if spec.kind is TensorKind.FP8_ROWS:
        return _stored_rows(name, spec.logical_shape, gen)
    w = sample_weight(name, spec.logical_shape, gen)
    if spec.kind is TensorKind.PLAIN:
        return w.to(_plain_dtype(name, spec)), None
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    return quantize_tensor(spec, w, block)


def _stack(out: dict[str, Tensor], experts: dict[tuple[str, str], list[Stored]]) -> None:
    for (prefix, w), tensors in experts.items():
        out[f"{prefix}.{w}.weight"] = torch.stack([t for t, _ in tensors])
        out[f"{prefix}.{w}.scale"] = torch.stack([s for _, s in tensors if s is not None])
    experts.clear()


def _serving_layout(
    cfg: ModelConfig, make: Callable[[str, TensorSpec], Stored], *, dspark: bool
) -> dict[str, Tensor]:
    """The step graph's weights in the serving layout, each stored tensor (and scale) from `make`; routed
    experts are made one at a time and stacked per layer (a layer's experts are contiguous in spec
    order, so the peak is one layer's experts twice)."""
    out: dict[str, Tensor] = {}
    experts: dict[tuple[str, str], list[Stored]] = {}
    for name, spec in expected_tensors(cfg).items():
        if spec.kind is TensorKind.SCALE or (name.startswith("mtp.") and not dspark):
            continue
        m = _EXPERT.fullmatch(name)
        if m is not None:
            experts.setdefault((m[1], m[3]), []).append(make(name, spec))
            continue
        _stack(out, experts)
        t, s = make(name, spec)
        out[name] = t
        if s is not None:
            out[scale_name(name)] = s
    _stack(out, experts)
    return out


def _host_table(stored: Stored, min_bytes: int) -> Stored:
    """An Engram table (and its scales) moved to pinned host memory, where the cuda platform reads it
    (platform/cuda/placement.py); generated on the device first, so its bytes are the same."""
    t, s = stored
    if t.numel() * t.element_size() < min_bytes:
        return stored
    return pin_host(t), None if s is None else pin_host(s)


def random_serving_weights(
    cfg: ModelConfig,
    token_map: list[int],
    seed: int = 0,
    device: str = "cuda",
    *,
    dspark: bool = False,
    host_min_bytes: int | None = None,
) -> dict[str, Tensor]:
    """The step graph's weight inputs (serving numerics) on `device`; DSpark (`mtp.*`) ones with `dspark`.
    On a CUDA device Engram tables of >= host_min_bytes are returned pinned on the host, as Session
    places them (so the bench reads them over PCIe, like the released ~100 GB tables must be)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def make(name: str, spec: TensorSpec) -> Stored:
        stored = _stored(cfg, name, spec, gen)
        min_bytes = host_table_min_bytes(name, device, host_min_bytes)
        return stored if min_bytes is None else _host_table(stored, min_bytes)

    out = _serving_layout(cfg, make, dspark=dspark)
    out["engram.token_map"] = torch.tensor(token_map, dtype=torch.int32, device=device)
    return out


def random_stored_weights(cfg: ModelConfig, seed: int = 0, device: str = "cpu") -> dict[str, Tensor]:
    """Every tensor of the checkpoint layout (`expected_tensors`, scales included), random, as
    `load_checkpoint(..., weights="stored")` returns a checkpoint's."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, Tensor] = {}
    for name, spec in expected_tensors(cfg).items():
        if spec.kind is TensorKind.SCALE:
            continue
        t, s = _stored(cfg, name, spec, gen)
        out[name] = t
        if s is not None:
            out[scale_name(name)] = s
    return out


def dummy_weights(
    cfg: ModelConfig, num: Numerics, token_map: list[int], device: str, seed: int = 0
) -> dict[str, Tensor]:
    """The graph's weight inputs, random (DSpark stages included when the config has them)."""
    if num.stored_weights:
        dspark = cfg.text.num_nextn_predict_layers > 0
        return random_serving_weights(cfg, token_map, seed, device, dspark=dspark)
    return prepare_weights(cfg, random_stored_weights(cfg, seed, device), num, token_map)


def meta_serving_weights(cfg: ModelConfig, *, dspark: bool = False) -> dict[str, Tensor]:
    """The same names, shapes and dtypes as `random_serving_weights`, as meta tensors (no memory): what
    the traffic model needs to re-derive bytes from a saved run."""
    specs = expected_tensors(cfg)

    def empty(spec: TensorSpec, dtype: torch.dtype | None = None) -> Tensor:
        return torch.empty(spec.shape, dtype=dtype or torch_dtype(spec.dtype), device="meta")

    def make(name: str, spec: TensorSpec) -> Stored:
        if spec.kind is TensorKind.PLAIN:
            return empty(spec, _plain_dtype(name, spec)), None
        return empty(spec), empty(specs[scale_name(name)])

    out = _serving_layout(cfg, make, dspark=dspark)
    out["engram.token_map"] = torch.empty(cfg.text.vocab_size, dtype=torch.int32, device="meta")
    return out
