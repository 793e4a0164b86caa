"""A request's caches as bytes, in the released byte formats (`platform/cpu/cache_format.py`): the
global caches one page at a time (per ratio r: every tensor whose first dim is `blocks{r}`, i.e. the
NVFP4 compressed KV and MXFP4 index keys of each KV-source layer, in name order), and the per-request
state of one slot (every tensor whose first dim is `slots`: the FP8 SWA rings, the ratio-2 compressor
state, the DSpark context rings). Reading and writing work on any device the Session's caches live on."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from dsgraph.graph.types import TensorType
from dsgraph.models.deepseek_v41.layers_plan import LayerMode, LayerPlan


class CacheLayout:
    """Which cache tensors make up a page of each ratio and a slot, and their bytes per unit."""

    def __init__(self, cache_types: Mapping[str, TensorType], ratios: tuple[int, ...]) -> None:
        self.ratios = ratios
        self.page_names = {
            r: sorted(n for n, t in cache_types.items() if t.shape[0] == f"blocks{r}") for r in ratios
        }
        self.slot_names = sorted(n for n, t in cache_types.items() if t.shape[0] == "slots")

    @staticmethod
    def _rows(caches: Mapping[str, torch.Tensor], names: list[str], index: int) -> bytes:
        parts = [caches[n][index].contiguous().view(torch.uint8).reshape(-1).cpu() for n in names]
        return b"".join(p.numpy().tobytes() for p in parts)

    @staticmethod
    def _write(
        caches: Mapping[str, torch.Tensor], names: list[str], index: int, data: bytes, what: str
    ) -> None:
        want = sum(caches[n][index].numel() * caches[n].element_size() for n in names)
        if len(data) != want:
            raise ValueError(f"{what}: {len(data)} bytes, expected {want} for this engine's cache layout")
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        at = 0
        for n in names:
            row = caches[n][index]
            size = row.numel() * row.element_size()
            value = raw[at : at + size].view(row.dtype).view(row.shape)
            row.copy_(value.to(row.device))
            at += size

    def page_bytes(self, caches: Mapping[str, torch.Tensor], ratio: int, page: int) -> bytes:
        return self._rows(caches, self.page_names[ratio], page)

    def write_page(self, caches: Mapping[str, torch.Tensor], ratio: int, page: int, data: bytes) -> None:
        self._write(caches, self.page_names[ratio], page, data, f"page {page} of ratio {ratio}")

    def slot_bytes(self, caches: Mapping[str, torch.Tensor], slot: int) -> bytes:
        return self._rows(caches, self.slot_names, slot)

    def write_slot(self, caches: Mapping[str, torch.Tensor], slot: int, data: bytes) -> None:
        self._write(caches, self.slot_names, slot, data, f"state slot {slot}")


def global_bytes_per_token(plans: tuple[LayerPlan, ...], head_dim: int, index_head_dim: int) -> float:
    """Bytes of global (compressed) cache per token: per KV-source layer of ratio r, one NVFP4-g16 entry
    of the head and one MXFP4-g32 entry of the index key every r tokens."""
    from dsgraph.platform.registry import cache_entry_bytes

    entry = cache_entry_bytes(head_dim, index_head_dim)
    return math.fsum(entry / p.ratio for p in plans if p.mode is LayerMode.FULL)
