"""Where the cuda platform keeps each weight: the Engram tables (`layers.{i}.engram.embed.weight` and its
`.scale`: FP8 rows with UE8M0 row scales, ~100 GB each in the released model) in pinned host memory, read
by the row gathers over PCIe; every other weight in device memory.

A host-resident table is handed to the program as a CUDA tensor that aliases the pinned pages
(`device_view`): with unified virtual addressing a page-locked host address is valid on the device, torch
accepts it through `__cuda_array_interface__` (it refuses only unregistered host memory), and Triton's
launcher resolves it with `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_POINTER)`, which fails only
for memory the driver does not know. So every rule, the capture and the kernels see an ordinary CUDA
tensor and nothing is copied; each read of it is a PCIe transaction.

Pinning: a tensor already pinned is used as it is; otherwise its pages are registered in place with
`cudaHostRegister` (portable, mapped): no copy and no rounding of the size (torch's pinned allocator
rounds every block up to a power of two, 128 GiB for a 100 GB table). A tensor that cannot be registered
in place is copied into pinned memory once.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping

import torch
from torch import Tensor

from dsgraph.platform import env

__all__ = [
    "device_view",
    "host_min_bytes",
    "host_of",
    "host_resident",
    "host_tables",
    "is_host_table",
    "pin_in_place",
    "place_weights",
]

_TABLE = re.compile(r"(?:weights\.)?layers\.\d+\.engram\.embed\.(?:weight|scale)")
_REGISTER_PORTABLE_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped
_VIEW_OF: dict[int, Tensor] = {}  # id(device view) -> the host tensor it aliases (weak on the view)


def is_host_table(name: str) -> bool:
    """Whether `name` (a weight name, or a graph input name with its `weights.` prefix) is an Engram
    table or its row scales: the tensors the cuda platform may keep on the host."""
    return _TABLE.fullmatch(name) is not None


def host_min_bytes(min_bytes: int | None = None) -> int:
    """`min_bytes`, or by default DSGRAPH_ENGRAM_HOST_MIN_BYTES (1 GiB): the bench and released tables
    (GBs) stay on the host, the tiny test models' (KBs) in device memory where a gather costs nothing."""
    return env.engram_host_min_bytes() if min_bytes is None else min_bytes


def host_resident(name: str, nbytes: int, min_bytes: int | None = None) -> bool:
    """The placement rule: an Engram table (or its scales) of at least `min_bytes` stays in pinned host
    memory. A table's scales follow their table (pass the table's size for both)."""
    return is_host_table(name) and nbytes >= host_min_bytes(min_bytes)


def host_tables(weights: Mapping[str, Tensor], min_bytes: int | None = None) -> frozenset[str]:
    """Names of `weights` that stay on the host: the Engram tables of >= min_bytes and their scales."""
    out = set()
    for name, t in weights.items():
        table = weights.get(name.removesuffix(".scale") + ".weight", t) if name.endswith(".scale") else t
        if host_resident(name, table.numel() * table.element_size(), min_bytes):
            out.add(name)
    return frozenset(out)


def pin_in_place(t: Tensor) -> Tensor:
    """`t` in page-locked host memory: itself when already pinned, else its own pages registered with the
    driver (unregistered when the returned tensor is collected), else a pinned copy."""
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_pinned():
        return t
    t = t.contiguous()
    if t.numel() == 0:
        return t.pin_memory()
    cudart = torch.cuda.cudart()
    ptr, size = t.data_ptr(), t.numel() * t.element_size()
    if int(cudart.cudaHostRegister(ptr, size, _REGISTER_PORTABLE_MAPPED)) != 0:
        # e.g. file-backed pages: one copy into memory torch pins itself
        return t.pin_memory()
    weakref.finalize(t, cudart.cudaHostUnregister, ptr)
    return t


class _HostPages:
    """`__cuda_array_interface__` of pinned host bytes: torch.as_tensor builds a CUDA tensor over them
    (and keeps this object, hence the host tensor, alive as long as that tensor lives)."""

    def __init__(self, host: Tensor) -> None:
        self.host = host
        self.__cuda_array_interface__ = {
            "data": (host.data_ptr(), False),
            "shape": (host.numel() * host.element_size(),),
            "typestr": "|u1",
            "version": 2,
        }


def device_view(host: Tensor, device: torch.device) -> Tensor:
    """A CUDA tensor on `device` aliasing the pinned host tensor `host` (same shape and dtype, no copy)."""
    if not host.is_pinned() or not host.is_contiguous():
        raise ValueError(
            f"device_view: the host tensor {list(host.shape)} {host.dtype} must be pinned and contiguous "
            f"(pinned {host.is_pinned()}, contiguous {host.is_contiguous()})"
        )
    device = torch.device(device)
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    raw = torch.as_tensor(_HostPages(host), device=device)
    same_device = raw.device.type == "cuda" and device.index in (None, raw.device.index)
    if not same_device or raw.data_ptr() != host.data_ptr():
        raise RuntimeError(
            f"device_view: the alias of host memory at {host.data_ptr():#x} came back on {raw.device} at "
            f"{raw.data_ptr():#x}, expected {device} at the same address (UVA)"
        )
    view = raw.view(host.dtype).view(host.shape)
    _VIEW_OF[id(view)] = host
    weakref.finalize(view, _VIEW_OF.pop, id(view), None)
    return view


def host_of(view: Tensor) -> Tensor | None:
    """The pinned host tensor a `device_view` aliases (None for any other tensor)."""
    return _VIEW_OF.get(id(view))


def place_weights(
    weights: Mapping[str, Tensor], device: torch.device, min_bytes: int | None = None
) -> dict[str, Tensor]:
    """Every weight on `device`, except on a CUDA device the `host_tables` ones: pinned on the host and
    handed over as their `device_view`."""
    host = host_tables(weights, min_bytes) if device.type == "cuda" else frozenset()
    return {
        name: device_view(pin_in_place(t), device) if name in host else t.to(device)
        for name, t in weights.items()
    }
