"""Device timing: CUDA events around repeated calls, robust to outliers (drop min and max, take the
median). Every figure the bench reports comes from here, so calibrations and measurements share it."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10) -> float:
    """Median milliseconds of one call of `fn` on the current CUDA stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: list[float] = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    trimmed = sorted(times)[1:-1] if len(times) > 4 else times
    return statistics.median(trimmed)


def graph_time_ms(fn: Callable[[], object], *, repeats: int = 10) -> float:
    """Like `time_ms`, but `fn` is captured once into a CUDA graph and the replay is timed (no launch
    overhead: the figure a captured step program sees)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, warmup=2, repeats=repeats)
