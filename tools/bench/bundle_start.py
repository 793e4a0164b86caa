"""`dsgraph bench bundle-start`: time to first token of a cold start against a start from an
ahead-of-time bundle (docs/bundle.md), weight loading excluded from both.

On cuda the model is the 8-layer full-width bench model (tools/bench/model_config.py) with random
weights generated on the GPU (load_format dummy); on cpu the embedded tiny model. Each of compile, cold
start and bundle start runs in a fresh process (tools/bench/bundle_start_child.py) with its own empty
cache folder, so the cold start finds no Triton kernels and no profiled curves, and the bundle start
finds only the bundle's. Writes one JSON: device, commit, date, both times, their ratio and the target
(the bundle start >= 5x faster than cold and under 30 s)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dsgraph.platform import env

TARGET_RATIO = 5.0
TARGET_BUNDLE_S = 30.0


def _model_dir(args: argparse.Namespace, tmp: Path) -> str:
    if args.model:
        return str(Path(args.model).resolve())
    if args.platform == "cpu":
        from dsgraph.tools.generate_cmd import default_model_dir

        return str(default_model_dir())
    from dsgraph.tools.bench.model_config import bench_config_dict

    cfg = bench_config_dict()
    if args.experts:
        cfg["text_config"]["n_routed_experts"] = args.experts
    root = tmp / "model"
    root.mkdir(exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    return str(root)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "platform": args.platform,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "speculative": args.speculative,
        "prefill_truncation": args.prefill_truncation,
        "load_format": "dummy" if args.platform == "cuda" and not args.model else "auto",
    }


def _child(task: dict[str, Any], cache: Path, timeout_s: float) -> dict[str, Any]:
    """Runs one measurement with XDG_CACHE_HOME and TRITON_CACHE_DIR in a fresh folder of its own."""
    cache.mkdir(parents=True)
    environ = env.child_environ(XDG_CACHE_HOME=str(cache), TRITON_CACHE_DIR=str(cache / "triton"))
    cmd = [sys.executable, "-m", "dsgraph.tools.bench.bundle_start_child", json.dumps(task)]
    done = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"bench bundle-start: {task['mode']} failed ({done.returncode}):\n{done.stderr[-4000:]}"
        )
    return json.loads(lines[-1].removeprefix("RESULT "))


def _model_name(args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    if args.platform == "cpu":
        return "tiny (embedded)"
    return f"bench 8-layer full width, experts {args.experts or 'all'}"


STAGES = ("compile", "cold", "bundle")


def _stages(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Runs the asked stages in `work`, keeping each stage's result there (`<stage>.json`), so a run
    split over several commands (`--stages compile`, then `--stages cold,bundle`) sees the earlier ones."""
    model = work / "model"
    task = {
        "model": str(model) if model.is_dir() else _model_dir(args, work),
        "config": _config(args),
        "bundle": str(work / "bundle"),
        "prompt": [(7 * i + 3) % 97 + 2 for i in range(args.prompt_tokens)],
        "profile": args.profile,
    }
    done: dict[str, Any] = {"task": task}
    for stage in STAGES:
        path = work / f"{stage}.json"
        if stage in args.stages.split(","):
            path.unlink(missing_ok=True)
            shutil.rmtree(work / f"cache-{stage}", ignore_errors=True)
            if stage == "compile":
                shutil.rmtree(work / "bundle", ignore_errors=True)
            began = time.perf_counter()
            result = _child({**task, "mode": stage}, work / f"cache-{stage}", args.timeout_s)
            path.write_text(json.dumps(result))
            print(f"bench bundle-start: {stage} took {time.perf_counter() - began:.1f} s", flush=True)
        if path.is_file():
            done[stage] = json.loads(path.read_text())
    return done


def measure(args: argparse.Namespace) -> dict[str, Any] | None:
    """The result, or None while a stage has not run yet (with --work, over several commands)."""
    from dsgraph.tools.bench.meta import commit, device_name

    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        got = _stages(args, Path(args.work))
    else:
        with tempfile.TemporaryDirectory(prefix="dsgraph-bundle-start-") as name:
            got = _stages(args, Path(name))
    if any(stage not in got for stage in STAGES):
        return None
    task, compiled, cold, warm = got["task"], got["compile"], got["cold"], got["bundle"]
    ratio = cold["ttft_s"] / warm["ttft_s"]
    return {
        "bench": "bundle-start",
        "device": device_name(args.platform),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": _model_name(args),
        "config": task["config"],
        "prompt_tokens": args.prompt_tokens,
        # module imports compile Python sources to bytecode unless a cached .pyc is found: both starts
        # pay the same, but only where bytecode can be written does the first start's work carry over
        "python_bytecode": {"written": not sys.flags.dont_write_bytecode, "prefix": sys.pycache_prefix},
        "cold_ttft_s": cold["ttft_s"],
        "bundle_ttft_s": warm["ttft_s"],
        "ratio": ratio,
        "same_first_token": cold["token"] == warm["token"],
        "target": {"ratio_at_least": TARGET_RATIO, "bundle_under_s": TARGET_BUNDLE_S},
        "meets_target": ratio >= TARGET_RATIO and warm["ttft_s"] < TARGET_BUNDLE_S,
        "compile": compiled,
        "cold": cold,
        "bundle": warm,
    }


def run(args: argparse.Namespace) -> int:
    result = measure(args)
    if result is None:
        print(f"bench bundle-start: {args.stages} done in {args.work}; run the other stages with this --work")
        return 0
    out = Path(args.out) if args.out else None
    if out is None:
        device = result["device"].replace(" ", "-")
        out = Path("bench/results") / f"bundle-start-{device}-{result['commit'][:7]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    met = "met" if result["meets_target"] else "NOT met"
    print(
        f"cold {result['cold_ttft_s']:.2f} s, bundle {result['bundle_ttft_s']:.2f} s, "
        f"ratio {result['ratio']:.1f}x (target >= {TARGET_RATIO}x and < {TARGET_BUNDLE_S} s: {met}); {out}"
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--platform", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--model", default=None, help="a checkpoint instead (default: bench model / tiny model)")
    p.add_argument("--experts", type=int, default=None, help="cuda: routed experts kept (default: all 384)")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--max-num-batched-tokens", type=int, default=32, help="sets the bucket list compiled")
    p.add_argument("--speculative", choices=["auto", "dspark", "off"], default="off")
    p.add_argument("--prefill-truncation", choices=["off", "mask", "compact"], default="off")
    p.add_argument("--prompt-tokens", type=int, default=24)
    p.add_argument("--timeout-s", type=float, default=1500.0, help="per process")
    p.add_argument(
        "--profile", default=None, help="folder: each stage runs under cProfile, its report written there"
    )
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {STAGES}")
    p.add_argument(
        "--work", default=None, help="folder kept between runs of some --stages (default: temporary)"
    )
    p.add_argument(
        "--out", default=None, help="JSON path (default bench/results/bundle-start-DEVICE-COMMIT.json)"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bundle-start", help="time to first token: cold start vs an ahead-of-time bundle")
    add_arguments(p)
    p.set_defaults(func=run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
