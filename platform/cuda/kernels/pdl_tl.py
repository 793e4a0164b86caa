"""Triton side of programmatic dependent launch (platform/cuda/pdl.py).

`enter(PDL)` at the top of a kernel, before its first load of anything another kernel wrote: wait until
the kernel before it in the stream has finished and its writes are visible (griddepcontrol.wait), then
(PDL == 1) let the next kernel launch (griddepcontrol.launch_dependents). Letting it launch only after the
wait keeps one kernel in flight ahead, never a chain of waiting ones holding the SMs. PDL == 2 waits but
never signals: the next kernel then launches when this one's programs have all exited (the implicit
trigger), which overlaps only its launch with this one's end. Weights, which no kernel
writes, may be read before `enter`: `prefetch_l2` asks for a program's weight bytes while the previous
kernel still runs, so the GEMM's loads after the wait find them in L2.
Both instructions are no-ops in a launch without PDL, but Triton's interpreter has neither, so PDL is a
constexpr that the host sets only on a GPU that has them."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def enter(PDL: tl.constexpr) -> None:
    if PDL:
        gdc_wait()
        if PDL == 1:
            gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs, nbytes) -> None:
    """One bulk L2 prefetch of `nbytes` (a multiple of 16) from each pointer (16-byte aligned): a hint,
    no data moves into registers and nothing waits for it."""
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
        "=r,l,r",
        [ptrs, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
