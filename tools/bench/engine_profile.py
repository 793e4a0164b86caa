"""Where an engine-loop step's time goes (`dsgraph bench engine --profile-steps N`): N more steps of a
batch, once under torch's profiler and once under cProfile, after the timed ones.

- device: the kernels' busy time per step (the sum of their durations; less than the step when the
  device waits for the host) and the kernels ranked by their time;
- host: per step, the wall time of each phase of the loop that matters for overlap (launching the next
  step, waiting for the previous step's tokens, the native plan/commit call, events and detokenization),
  and the Python functions ranked by their own time.
A step whose device busy time is well under its wall time is host-bound: the host ranking says where."""

from __future__ import annotations

import cProfile
import pstats
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from dsgraph.runtime.engine import Engine

TOP = 15
# The loop's phases: (object attribute path, method) pairs wrapped with timers while profiling.
# Overlapped: launch_sampled, wait for tokens, advance_ahead; plain: submit, wait, advance; both: events.
# A phase may hold another (the plain wait may wait for tokens): phases do not sum to the step.
PHASES = (
    ("runner", "launch_sampled"),
    ("runner", "submit"),
    ("runner", "wait"),
    ("scheduler", "advance_ahead"),
    ("scheduler", "advance"),
    ("scheduler", "schedule"),
    ("engine", "finish_step"),
)


@contextmanager
def _timed_phases(engine: Engine, totals: dict[str, float]) -> Iterator[None]:
    """Wraps each phase's method on its object (instance attributes, removed afterwards) to add its
    wall time to `totals`; waiting for tokens is timed through `PendingSamples.wait`."""
    from dsgraph.runtime import sampler

    owners = {"engine": engine, "runner": engine.runner, "scheduler": engine.scheduler}
    wrapped: list[tuple[object, str]] = []

    def timer(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - start

        return call

    for owner_name, method in PHASES:
        owner = owners[owner_name]
        setattr(owner, method, timer(f"{owner_name}.{method}", getattr(owner, method)))
        wrapped.append((owner, method))
    wait = sampler.PendingSamples.wait
    sampler.PendingSamples.wait = timer("wait for tokens", wait)  # type: ignore[method-assign]
    try:
        yield
    finally:
        sampler.PendingSamples.wait = wait  # type: ignore[method-assign]
        for owner, method in wrapped:
            delattr(owner, method)


def host_profile(engine: Engine, steps: int) -> dict[str, Any]:
    """Per-step phase times (ms) and the top functions by own time over `steps` steps."""
    totals: dict[str, float] = defaultdict(float)
    prof = cProfile.Profile()
    with _timed_phases(engine, totals):
        start = time.perf_counter()
        prof.enable()
        for _ in range(steps):
            engine.step()
        prof.disable()
        wall = time.perf_counter() - start
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP]  # type: ignore[attr-defined]
    return {
        "step_ms_under_cprofile": wall / steps * 1e3,
        "phase_ms_per_step": {k: v / steps * 1e3 for k, v in sorted(totals.items())},
        "top_own_time": [
            {"function": f"{path.split('dsgraph/')[-1]}:{line}({name})", "own_ms_per_step": tt / steps * 1e3}
            for (path, line, name), (_cc, _nc, tt, _ct, _callers) in rows
        ],
    }


def device_profile(engine: Engine, steps: int, on_cuda: bool) -> dict[str, Any]:
    """Wall and kernel busy time per step, and the top kernels, over `steps` steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        if on_cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if on_cuda and ev.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[ev.name[:120]]
            k[0] += ev.device_time / 1e3  # us -> ms
            k[1] += 1
    busy = sum(v[0] for v in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: kv[1][0], reverse=True)[:TOP]
    return {
        "step_ms_under_profiler": wall / steps * 1e3,
        "kernel_busy_ms_per_step": busy / steps,
        "kernels_per_step": sum(v[1] for v in kernels.values()) / steps,
        "top_kernels": [
            {"kernel": name, "ms_per_step": v[0] / steps, "launches_per_step": v[1] / steps}
            for name, v in top
        ],
    }


def profile_case(engine: Engine, steps: int) -> dict[str, Any]:
    on_cuda = engine.config.platform == "cuda"
    return {
        "steps": steps,
        "device": device_profile(engine, steps, on_cuda),
        "host": host_profile(engine, steps),
    }
