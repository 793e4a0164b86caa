"""Reference meaning of prev_hidden (dsgraph.ops.mtp), in torch. Fixed shapes and no host read outside
the checks, so the same rule runs captured on cuda."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu.step_rows import checking, per_row, real_rows, require_in_range


def _check_previous_rows(pos: Tensor, seq: Tensor, in_chunk: Tensor) -> None:
    """A row after its chunk's start must follow the row of its sequence's previous position."""
    prev = (torch.arange(pos.shape[0], device=pos.device) - 1).clamp_min(0)
    wrong = in_chunk & ((pos[prev] != pos - 1) | (seq[prev] != seq))
    if bool(wrong.any()):
        t = int(wrong.nonzero()[0, 0])
        raise ValueError(
            f"prev_hidden: row {t} (position {int(pos[t])}) is after its chunk's start but row {t - 1} does "
            "not hold the previous position of its sequence; rows must be contiguous"
        )


def prev_hidden(
    _p: Any,
    ring: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    seq_slot: Tensor,
    seq_start: Tensor,
    hidden: Tensor | None = None,
) -> Tensor:
    real, seq = real_rows("prev_hidden", seq_ids, seq_slot.shape[0])
    require_in_range("prev_hidden", per_row(seq_slot, seq, real), ring.shape[0], "seq_slot of row", real)
    pos = positions.long()
    slot, start = per_row(seq_slot, seq, real), per_row(seq_start, seq, real)
    ring_len = ring.shape[1]
    stored = ring[slot, torch.remainder(pos - 1, ring_len)].contiguous().view(torch.float32)  # [T, W]
    out = stored
    if hidden is not None:
        in_chunk = real & (pos > start)
        if checking():
            _check_previous_rows(pos, seq, in_chunk)
        shifted = hidden[(torch.arange(pos.shape[0], device=pos.device) - 1).clamp_min(0)]
        out = torch.where(in_chunk.unsqueeze(1), shifted, stored)
    return torch.where((real & (pos > 0)).unsqueeze(1), out, torch.zeros((), dtype=out.dtype))


RULES: dict[str, Any] = {"prev_hidden": prev_hidden}
