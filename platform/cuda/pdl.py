"""Programmatic dependent launch (PDL, sm_90 and later): the launch options of a kernel that waits for
the kernel before it in the stream itself (`pdl_tl.enter`), so the GPU may start it while that one is
still running: its launch, its index arithmetic and (the GEMMs) the L2 prefetch of its weights overlap
the previous kernel's tail instead of following it. A decode step is ~270 launches of a few
microseconds each, so the gaps between them are a large part of it.

Only kernels that call `pdl_tl.enter` before their first read of another kernel's output may take these
options; every other launch (torch's, the kernels that do not wait) stays a plain one, which waits for
everything before it as always. Results do not change, only when each kernel starts.

Off unless DSGRAPH_PDL=1. Measured on an H100 (tools/bench/pdl_ab.py,
bench/results/pdl-ab-H100-f248b22.json), the bench model's captured decode step ran at 0.95x (b1: 4.24
against 4.03 ms) and 1.00x (b64) the plain launches' speed, 0.98x / 0.99x with the 1 KiB prefetch and
0.87x / 0.97x prefetching whole rows, while a synthetic chain of GEMV and element-wise kernels ran 1.15x
faster with it (pdl_chain.py). Where the step loses the chain's gain is not known yet (its torch
launches, side stream and split GEMMs are the differences to look at), so the mechanism stays, compiled
and tested, for that work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch

from dsgraph.platform import env

__all__ = ["PREFETCH_ROW_BYTES", "launch", "on", "prefetch_bytes", "setting"]

# Bytes of each weight row a decode GEMM program asks L2 for before it waits: its first pipeline steps
# only. A program's whole K range at once (~100 MB over the resident programs of the head) made the step
# slower still (bench/results/pdl-ab-H100-f248b22.json: 0.87x at b1).
PREFETCH_ROW_BYTES = 1024

_forced: list[tuple[bool, int, bool]] = []  # `setting`'s stack: its innermost value overrides the defaults


@cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def on() -> bool:
    """Whether kernel launches use PDL: not under Triton's interpreter (which launches nothing on a GPU),
    DSGRAPH_PDL=1 (or a `setting`), and the current CUDA device is sm_90 or later. (The rules launch
    kernels only for tensors on the current device, or under the interpreter.)"""
    wanted = _forced[-1][0] if _forced else env.pdl()
    if env.triton_interpreting() or not wanted or not torch.cuda.is_available():
        return False
    return _capable(torch.cuda.current_device())


def launch() -> dict[str, Any]:
    """The extra launch arguments of a kernel that calls pdl_tl.enter(PDL): {PDL, launch_pdl} when `on`,
    else none (its PDL constexpr defaults to off). PDL is 1 (wait, then let the next kernel launch) or,
    under `setting(..., early=False)`, 2 (wait only: pdl_tl.enter)."""
    if not on():
        return {}
    early = _forced[-1][2] if _forced else True
    return {"PDL": 1 if early else 2, "launch_pdl": True}


def prefetch_bytes() -> int:
    """Bytes per weight row the decode GEMMs prefetch before they wait (0: none; only with PDL on)."""
    if not on():
        return 0
    return _forced[-1][1] if _forced else PREFETCH_ROW_BYTES


@contextmanager
def setting(on: bool, prefetch: int = PREFETCH_ROW_BYTES, early: bool = True) -> Iterator[None]:
    """PDL on or off (the GEMMs' prefetch bytes per row; whether a kernel lets the next one launch as soon
    as it passed its wait) for the launches inside, whatever DSGRAPH_PDL says: a bench comparing them in
    one process (a captured bucket keeps the launches of its capture)."""
    _forced.append((on, prefetch, early))
    try:
        yield
    finally:
        _forced.pop()
