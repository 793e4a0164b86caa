"""The arrival counts of kernels whose last program to finish adds what the others wrote (a split GEMM's
K ranges, kernels/linear_tl.store_tile; hc_pre's row slices, kernels/mhc_tl.hc_pre_kernel). It launches no
kernel of its own (a plain allocation), so it sits beside the kernel modules, not among them.

One int32 count per output tile or row, zero between launches: the last part to arrive resets its count.
One buffer per device serves every launch: launches that use it run in stream order (the side stream
carries no GEMM and no hc_pre), so no two are in flight at once.
"""

from __future__ import annotations

import torch
from torch import Tensor

COUNT_SLOTS = 1 << 20
_COUNTS: dict[torch.device, Tensor] = {}


def arrival_counts(device: torch.device, slots: int) -> Tensor:
    """The device's zeroed arrival counts, `slots` of them used (allocated at the first launch that needs
    them, which a capture's eager warm-up runs before any capture)."""
    if slots > COUNT_SLOTS:
        raise ValueError(f"split sums: {slots} tiles or rows in one launch, over the {COUNT_SLOTS} counts")
    counts = _COUNTS.get(device)
    if counts is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("split sums: the arrival counts must be allocated before a capture")
        counts = _COUNTS[device] = torch.zeros(COUNT_SLOTS, dtype=torch.int32, device=device)
    return counts
