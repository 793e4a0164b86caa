"""What every bench JSON records about where it ran: the commit and the device. Light on imports (no
compiled runtime), so `bench v4` can still write its result when it runs beside another engine's packages."""

from __future__ import annotations

from dsgraph.runtime.bundle.manifest import source_commit as commit

__all__ = ["commit", "device_name"]


def device_name(platform: str) -> str:
    """What a result's "device" field says: the GPU's name on cuda, "cpu" otherwise."""
    if platform != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name()
