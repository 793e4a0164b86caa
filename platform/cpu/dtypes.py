"""IR dtype names <-> torch dtypes; constant tables on a device."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "f8e4m3": torch.float8_e4m3fn,
    "e8m0": torch.float8_e8m0fnu,
    "u8": torch.uint8,
    "i8": torch.int8,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
}
IR_DTYPES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}


def to_torch(dtype: str) -> torch.dtype:
    return TORCH_DTYPES[dtype]


def to_ir(dtype: torch.dtype) -> str:
    if dtype not in IR_DTYPES:
        raise TypeError(f"torch dtype {dtype} has no IR dtype; known: {sorted(TORCH_DTYPES)}")
    return IR_DTYPES[dtype]


_CONSTANTS: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def constant(values: tuple, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A read-only table built once per device: rules index it instead of rebuilding it each call, and a
    CUDA-graph capture finds it already on the device (a host-to-device copy cannot be captured).
    Under a fake-tensor mode (shape probes) the table is built fresh and not kept."""
    if type(torch.empty(0)) is not torch.Tensor:  # a tensor-subclass mode (fake tensors) is active
        return torch.tensor(values, dtype=dtype, device=device)
    key = (repr(values), dtype, torch.device(device))  # repr: -0.0 == 0.0 but the tables differ
    table = _CONSTANTS.get(key)
    if table is None:
        table = _CONSTANTS[key] = torch.tensor(values, dtype=dtype, device=device)
    return table
