"""What a platform's devices are to an expert-parallel group: the collective backend, one device per
rank, how many there are and their memory (cpu: gloo, no device limits)."""

from __future__ import annotations

import torch


def collective_backend(platform: str) -> str:
    return "nccl" if platform == "cuda" else "gloo"


def bind_rank_device(platform: str, local_rank: int) -> None:
    """A cuda rank owns GPU `local_rank` of its node (before the process group starts)."""
    if platform == "cuda":
        torch.cuda.set_device(local_rank)


def device_count(platform: str) -> int | None:
    """Devices of this machine (None: not limited, the cpu platform)."""
    return torch.cuda.device_count() if platform == "cuda" else None


def device_memory_bytes(platform: str) -> int | None:
    if platform != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)
