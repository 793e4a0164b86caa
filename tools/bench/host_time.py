"""Host time per decode step of the 8-layer bench model (tools/bench/model_config.py) on the cuda
platform, with captured buckets replayed from Python (every piece's `CUDAGraph.replay()`) and from C++
(one `ReplayTable.launch` per step; platform/cuda/runner.py). The host time is the wall time of
`Session.run` with the GPU idle before the call (synchronized), so it is the CPU cost of padding,
staging, the input copy and the launch, not the GPU's work. The two modes' sessions live side by side and
are timed in alternating rounds, so a drift of the machine (clocks, other load) falls on both.

    python -m dsgraph.tools.bench.host_time [--out bench/host_time.json] [--batches 1 64] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.tools.bench.model_bench import fill_caches, make_model, session_for, synthetic_token_map
from dsgraph.tools.bench.model_config import bench_config
from dsgraph.tools.bench.run import environment
from dsgraph.tools.bench.steps import decode_step

CONTEXT = 1024  # short: the host cost does not depend on the context, the cache memory does


ROUNDS = 10  # the modes alternate in rounds (order flipped each round), so drift hits both alike


def timed_runs(session: Any, step: dict[str, Any], count: int) -> list[float]:
    """Host wall times (ms) of `count` calls of `session.run(step)`, the GPU idle before each."""
    times = []
    for _ in range(count):
        torch.cuda.synchronize()
        start = time.perf_counter()
        session.run(step)
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return times


def summary(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {"median_ms": statistics.median(times), "p90_ms": times[int(0.9 * (len(times) - 1))]}


def mode_session(model: Any, weights: Any, batch: int, mode: str) -> Any:
    session = session_for(model, weights, batch, CONTEXT)
    if mode == "python":  # before the first capture: no bucket is registered with C++
        session.runner.table = None
    elif session.runner.table is None:
        raise SystemExit("host_time: the native module has no ReplayTable (rebuild it)")
    fill_caches(session)
    return session


def measure_batch(model: Any, weights: Any, batch: int, repeats: int) -> dict[str, Any]:
    """Both modes' sessions side by side, each captured and warmed, then timed in alternating rounds."""
    step = decode_step(model, batch, CONTEXT)
    sessions = {mode: mode_session(model, weights, batch, mode) for mode in ("python", "cpp")}
    for session in sessions.values():
        for _ in range(3):  # capture, then warm replays
            session.run(step)
    times: dict[str, list[float]] = {mode: [] for mode in sessions}
    for r in range(ROUNDS):
        for mode in sorted(sessions, reverse=r % 2 == 1):
            times[mode] += timed_runs(sessions[mode], step, max(1, repeats // ROUNDS))
    row: dict[str, Any] = {"batch": batch, "context": CONTEXT}
    for mode, session in sessions.items():
        row[mode] = summary(times[mode])
        row[f"{mode}_graphs"] = sum(c.num_graphs for c in session.captured.values())
    row["ratio_cpp_over_python"] = row["cpp"]["median_ms"] / row["python"]["median_ms"]
    # the same step on the same caches' state: each session's caches took the same writes
    row["same_logits"] = bool(torch.equal(*(s.run(step).clone() for s in sessions.values())))
    return row


def measure(batches: list[int], repeats: int) -> dict[str, Any]:
    cfg = bench_config()
    model = make_model(cfg, CONTEXT)
    weights = random_serving_weights(cfg, synthetic_token_map(cfg))
    cases = []
    for batch in batches:
        cases.append(measure_batch(model, weights, batch, repeats))
        torch.cuda.empty_cache()
    return {"env": environment(), "repeats": repeats, "rounds": ROUNDS, "decode": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/host_time.json"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_time: no CUDA device (this measures the cuda platform's replay)")
    result = measure(args.batches, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["decode"], indent=2))


if __name__ == "__main__":
    main()
