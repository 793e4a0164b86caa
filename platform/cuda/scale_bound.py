"""Whether every UE8M0 scale byte of an MXFP4 weight is at most 128, known on the host once per tensor.

The MoE decode PTX (moe_swap_tl._E2M1_PAIRS_ASM_ONE) scales each code pair with one multiply by 2^(s-1),
which BF16 holds only for s <= 128 (weights below 2^2 x 6 in magnitude: every trained checkpoint); other
bytes (and 255, NaN) need the two-multiply form. Both are exact, so the choice changes no bit, only the
instruction count. Deciding inside the kernel costs more than it saves (two K loops double the shared
memory and cut the blocks per SM), so the launch decides from a host-side bound: the tensor's maximum
byte, read back once and kept with the tensor's identity and version counter (an in-place write bumps
it, so the bound is read again). During a CUDA-graph capture nothing may be read back: a tensor seen
first there gets the two-multiply form (the capture's eager warm-up runs the same launch first, so in
practice the bound is known by then).
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

__all__ = ["scales_at_most_128"]

_KNOWN: dict[int, tuple[int, bool]] = {}  # id(tensor) -> (its _version when read, max byte <= 128)


def _forget(key: int) -> None:
    _KNOWN.pop(key, None)


def _bound(t: Tensor) -> bool | None:
    """The tensor's bound, read now unless known for its current version; None while capturing."""
    known = _KNOWN.get(id(t))
    if known is not None and known[0] == t._version:
        return known[1]
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    ok = t.numel() == 0 or int(t.view(torch.uint8).max()) <= 128
    if known is None:
        weakref.finalize(t, _forget, id(t))
    _KNOWN[id(t)] = (t._version, ok)
    return ok


def scales_at_most_128(*scales: Tensor | None) -> bool:
    """True when every byte of every given UE8M0 scale tensor (None: skipped) is at most 128."""
    return all(_bound(t) is True for t in scales if t is not None)
