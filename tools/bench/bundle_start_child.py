"""One measurement of `dsgraph bench bundle-start`, in a process of its own (tools/bench/bundle_start.py
starts it): `compile` writes the bundle; `cold` and `bundle` time a start to the first token of one greedy
request, less the time spent loading (or generating) the weights. Prints one JSON line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _sync(platform: str) -> None:
    if platform == "cuda":
        import torch

        torch.cuda.synchronize()


def _timed_weights(platform: str) -> dict[str, float]:
    """Wraps the engine's weight loading so its seconds can be taken out of the start."""
    from dsgraph.runtime import engine as engine_module

    spent = {"s": 0.0}
    load = engine_module.load_weights

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = load(*args, **kwargs)
        _sync(platform)
        spent["s"] += time.perf_counter() - start
        return out

    engine_module.load_weights = timed
    return spent


def _kernel_events(platform: str) -> dict[str, list[str]]:
    """Triton's compile events from now on, by kernel name: "compiled" (a cache miss) and "cached" (read
    from the cache folder). Counted from Triton itself, not from the files in its cache: a miss whose
    kernel has the hash of one already there rewrites the same files."""
    events: dict[str, list[str]] = {"compiled": [], "cached": []}
    if platform != "cuda":
        return events
    from triton import knobs

    def listen(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        del src, metadata_group, times
        events["cached" if cache_hit else "compiled"].append(str(metadata.get("name", "?")))

    knobs.compilation.listener = listen
    return events


def _start(model: str, config: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    from dsgraph.runtime.llm import LLM
    from dsgraph.runtime.sampling_params import SamplingParams

    spent = _timed_weights(config["platform"])
    kernels = _kernel_events(config["platform"])
    start = time.perf_counter()
    llm = LLM(model, **config)
    _sync(config["platform"])
    ready = time.perf_counter() - start
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=1))
    _sync(config["platform"])
    total = time.perf_counter() - start
    bundle = llm.engine.session.bundle
    result = {
        "ttft_s": total - spent["s"],
        "weights_s": spent["s"],
        "ready_s": ready - spent["s"],  # engine built (profiling included), weights excluded
        "total_s": total,
        "token": list(out[0].outputs[0].token_ids),
        "programs_built": llm.engine.session.programs_built,
        "kernels_compiled_at_start": len(kernels["compiled"]),
        "kernels_read_from_cache": len(kernels["cached"]),
        "compiled_kernels": sorted(set(kernels["compiled"])),
    }
    if bundle is not None:
        result["programs_loaded"] = bundle.programs_loaded
    return result


def _compile(model: str, config: dict[str, Any], out: str) -> dict[str, Any]:
    from dsgraph.runtime.bundle.compile import compile_bundle
    from dsgraph.runtime.engine_config import EngineConfig

    start = time.perf_counter()
    manifest = compile_bundle(Path(model), EngineConfig.from_flat(**config), Path(out), log=lambda _msg: None)
    files = [Path(out) / rel for rel in manifest["files"]]
    return {
        "compile_s": time.perf_counter() - start,
        "bundle_bytes": sum(p.stat().st_size for p in files),
        "buckets": {k: len(v) for k, v in manifest["buckets"].items()},
        "kernels_in_bundle": len(manifest["kernels"].get("binaries", [])),
    }


def _profiled(task: dict[str, Any]) -> dict[str, Any]:
    """`_measure` under cProfile, its 60 costliest calls (cumulative and own time) written as text to
    task["profile"]/<mode>.txt: where a start's seconds go."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    threads = _profile_threads()
    result = profiler.runcall(_measure, task)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    for done in threads:  # the engine's worker threads (a step may run there, not on this thread)
        try:
            stats.add(done)
        except (TypeError, ValueError, RuntimeError):
            text.write("(a thread still running: its profile is left out)\n")
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(60)
    stats.print_callers("acquire|waitpid|builtins.compile")  # who waits on a lock or a child, who compiles
    folder = Path(task["profile"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{task['mode']}.txt").write_text(text.getvalue())
    return result


def _profile_threads() -> list[Any]:
    """Every thread started from now on runs under a profiler of its own, returned in this list."""
    import cProfile
    import threading

    profiles: list[Any] = []
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.runcall(run, self)

    threading.Thread.run = profiled  # type: ignore[method-assign]
    return profiles


def _measure(task: dict[str, Any]) -> dict[str, Any]:
    if task["mode"] == "compile":
        return _compile(task["model"], task["config"], task["bundle"])
    config = dict(task["config"], bundle=task["bundle"] if task["mode"] == "bundle" else None)
    return _start(task["model"], config, task["prompt"])


def main(argv: list[str]) -> int:
    task = json.loads(argv[0])
    result = _profiled(task) if task.get("profile") else _measure(task)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
