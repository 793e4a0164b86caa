"""Checkpoint tensors -> the weight inputs of the step graph, in the layout a numerics mode wants.

The step graph takes routed experts stacked per layer (`layers.{i}.ffn.experts.w1.weight` [E, I, H]
and its `.scale`), the Engram token map (`engram.token_map` [V] i32) and every other tensor under its
checkpoint name. `reference` numerics dequantize FP8/FP4 weights to f32; `serving` keeps them stored.
Engram tables stay FP8 with row scales in both (they are ~100 GB each in the real model).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import Tensor

from dsgraph.graph.types import TensorType
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, expected_tensors, scale_name
from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.platform.cpu.dtypes import to_ir
from dsgraph.platform.cpu.quant import fp4_rows_dequantize, fp8_block_dequantize

_EXPERT = re.compile(r"(layers\.\d+\.ffn\.experts|mtp\.\d+\.ffn\.experts)\.(\d+)\.(w[123])\.(weight|scale)")


def _dequantize(name: str, kind: TensorKind, stored: Mapping[str, Tensor], block: tuple[int, int]) -> Tensor:
    t = stored[name]
    if kind is TensorKind.FP8_BLOCK:
        return fp8_block_dequantize(t, stored[scale_name(name)], torch.float32, block=block)
    if kind is TensorKind.FP4_ROWS:
        return fp4_rows_dequantize(t, stored[scale_name(name)], torch.float32)
    return t.float() if t.is_floating_point() else t


def release_dtype(name: str, t: Tensor) -> Tensor:
    """The LM head (F32 in NeMo's exports, BF16 in the release: numerics section 9) as BF16 when every
    value is exact in BF16: no weight value changes, and the largest read of a decode step halves (2.6 GB
    in F32 at V4.1's vocabulary). Serving's head input is the BF16 norm output either way, so the products
    are the same; only the FP32 summation runs on BF16 tensor cores (DeepInfer's BF16 GEMM with FP32
    output, numerics section 6). A head whose values are not exact in BF16 stays F32."""
    if name != "head.weight" or t.dtype != torch.float32 or t.is_meta:  # meta: no values to check
        return t
    half = t.to(torch.bfloat16)
    return half if torch.equal(half.float(), t) else t


def _convert(cfg: ModelConfig, stored: Mapping[str, Tensor], num: Numerics) -> dict[str, Tensor]:
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    out: dict[str, Tensor] = {}
    specs = expected_tensors(cfg)
    for name, spec in specs.items():
        kind = (
            specs[name.removesuffix(".scale") + ".weight"].kind
            if spec.kind is TensorKind.SCALE
            else spec.kind
        )
        keep = num.stored_weights or kind is TensorKind.FP8_ROWS
        if keep:
            out[name] = release_dtype(name, stored[name])
        elif spec.kind is not TensorKind.SCALE:
            out[name] = _dequantize(name, spec.kind, stored, block)
    return out


def _stack_experts(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    groups: dict[tuple[str, str, str], dict[int, Tensor]] = {}
    out: dict[str, Tensor] = {}
    for name, t in tensors.items():
        m = _EXPERT.fullmatch(name)
        if m is None:
            out[name] = t
        else:
            groups.setdefault((m[1], m[3], m[4]), {})[int(m[2])] = t
    for (prefix, w, suffix), experts in groups.items():
        out[f"{prefix}.{w}.{suffix}"] = torch.stack([experts[e] for e in range(len(experts))])
    return out


def prepare_weights(
    cfg: ModelConfig, stored: Mapping[str, Tensor], num: Numerics, token_map: list[int]
) -> dict[str, Tensor]:
    """`stored` is `load_checkpoint(..., weights="stored")`; returns the graph's weight inputs by name."""
    out = _stack_experts(_convert(cfg, stored, num))
    out["engram.token_map"] = torch.tensor(token_map, dtype=torch.int32)
    return out


def weight_types(weights: Mapping[str, Tensor], *, backbone_only: bool = True) -> dict[str, TensorType]:
    """Graph input types of the weights (DSpark `mtp.*` tensors excluded from the backbone graph)."""
    return {
        name: TensorType(tuple(t.shape), to_ir(t.dtype))
        for name, t in weights.items()
        if not (backbone_only and name.startswith("mtp."))
    }
