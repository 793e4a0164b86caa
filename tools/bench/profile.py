"""Where a step's time goes: the step run eagerly on the device with a CUDA event pair around every
equation (value checks off, as in a captured step), summed per op. Launch gaps between equations are
not in the sums, so the total is below the eager step time and the ratios are what matter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dsgraph.platform.cpu.step_rows import unchecked
from dsgraph.runtime.session import Session


def op_profile(session: Session, step: Mapping[str, np.ndarray], top: int = 12) -> dict[str, Any]:
    program, args = session.bound_program(step)
    with unchecked():
        program.run(args, check=False)  # warm-up: kernels compiled, allocator primed
        env = program.bind(args)
        events = []
        for i in range(len(program.program.steps)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            program.run_step(i, env, check=False)
            end.record()
            events.append((program.program.steps[i].eqn.op, start, end))
        torch.cuda.synchronize()
    per_op: dict[str, list[float]] = {}
    for op, start, end in events:
        per_op.setdefault(op, []).append(start.elapsed_time(end))
    total = sum(sum(v) for v in per_op.values())
    rows = sorted(((op, sum(v), len(v)) for op, v in per_op.items()), key=lambda r: -r[1])
    return {
        "sum_ms": total,
        "ops": [{"op": op, "ms": ms, "count": n, "share": ms / total} for op, ms, n in rows[:top]],
    }


def captured_kernels(run: Any, top: int = 15) -> dict[str, Any]:
    """The GPU kernels of one captured step replay (`run()` replays it), from torch.profiler (CUPTI): how
    many kernels the step launches and which take the time. Unlike `op_profile` there is no launch
    overhead per equation here, so this is where a captured step's time really goes."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            per_kernel.setdefault(e.name, []).append(e.device_time * 1e-3)  # us -> ms
    total = sum(sum(v) for v in per_kernel.values())
    rows = sorted(((k, sum(v), len(v)) for k, v in per_kernel.items()), key=lambda r: -r[1])
    return {
        "kernels": sum(n for _, _, n in rows),
        "kernel_ms": total,
        "top": [
            {"kernel": k[:120], "ms": ms, "count": n, "share": ms / total if total else 0.0}
            for k, ms, n in rows[:top]
        ],
    }
