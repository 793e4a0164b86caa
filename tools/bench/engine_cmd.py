"""`dsgraph bench engine`: our engine's decode step against vLLM's on the same configuration
(tools/bench/engine_bench.py measures it). Writes one JSON: device, commit, date, the options and plan,
and per batch the step wall time (median, mean, p10, p90), tokens per step and per second, and the
differencing cross-check. With `--peer-json` (the JSON of vLLM's peer benchmark, `vllm_bench.py`, run on
the same machine), the result carries ours / vLLM per batch against the target ours <= vLLM; a peer run
whose prompt length, step counts or batches differ from ours is refused before anything is measured."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dsgraph.tools.bench.engine_bench import MODELS, EnginePlan

PEER_FIELDS = ("prompt_len", "steps", "warmup_steps", "diff_k")


def plan_of(args: argparse.Namespace) -> EnginePlan:
    try:
        batches = tuple(int(b) for b in args.batches.split(",") if b)
    except ValueError:
        raise ValueError(f"--batches: {args.batches!r}, expected comma-separated integers") from None
    return EnginePlan(
        batches, args.prompt_len, args.warmup_steps, args.steps, args.diff_k, args.profile_steps
    )


def load_peer(path: Path, plan: EnginePlan) -> dict[str, Any]:
    """vLLM's result, checked to measure what we measure: same prompt length, step counts and batches."""
    try:
        peer = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--peer-json {path}: not JSON ({exc})") from None
    peer_args = peer.get("args", {})
    for name in PEER_FIELDS:
        if peer_args.get(name) != getattr(plan, name):
            raise ValueError(
                f"--peer-json {path}: {name} is {peer_args.get(name)!r} there, {getattr(plan, name)!r} here"
            )
    missing = [b for b in plan.batches if str(b) not in peer.get("batches", {})]
    if missing:
        raise ValueError(f"--peer-json {path}: batches {missing} were not measured there")
    return peer


def compare(ours: dict[str, Any], peer: dict[str, Any], path: Path) -> dict[str, Any]:
    """Ours / vLLM per batch, for the engine-loop median and for the differencing figure."""
    rows = {}
    for batch, row in ours.items():
        theirs = peer["batches"][batch]
        ratio = row["step_ms_median"] / theirs["step_ms_median"]
        rows[batch] = {
            "ours_step_ms": row["step_ms_median"],
            "vllm_step_ms": theirs["step_ms_median"],
            "ratio": ratio,
            "diff_ratio": row["diff_step_ms"] / theirs["diff_step_ms"],
            "meets_target": ratio <= 1.0,
        }
    return {
        "path": str(path),
        "vllm": peer.get("vllm"),
        "torch": peer.get("torch"),
        "args": peer.get("args"),
        "target": "ours / vLLM <= 1 (engine-loop median) at every batch",
        "meets_target": all(r["meets_target"] for r in rows.values()),
        "batches": rows,
    }


def _model_name(model: str) -> str:
    if model == "bench":
        return "bench 8-layer full width (tools/bench/model_config.py), random weights"
    return "tiny (embedded config), random weights"


def prepare(args: argparse.Namespace) -> tuple[EnginePlan, dict[str, Any] | None, dict[str, Any]]:
    """The plan, the peer's result and the engine options; bad flags raise ValueError naming them."""
    from dsgraph.tools.bench.engine_bench import engine_options

    plan = plan_of(args)
    peer = load_peer(Path(args.peer_json), plan) if args.peer_json else None
    options = engine_options(args.platform, plan, args.max_model_len, args.speculative, args.overlap)
    if args.max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = args.max_num_batched_tokens
    return plan, peer, options


def result_of(
    args: argparse.Namespace, plan: EnginePlan, peer: dict[str, Any] | None, options: dict[str, Any]
) -> dict[str, Any]:
    import torch

    from dsgraph.tools.bench.engine_bench import config_dir, measure
    from dsgraph.tools.bench.meta import commit, device_name

    with tempfile.TemporaryDirectory(prefix="dsgraph-bench-engine-") as tmp:
        measured = measure(config_dir(args.model, Path(tmp)), options, plan)
    result = {
        "bench": "engine",
        "device": device_name(args.platform),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "model": _model_name(args.model),
        **measured,
    }
    if peer is not None:
        result["peer"] = compare(result["batches"], peer, Path(args.peer_json))
    return result


def default_out(result: dict[str, Any]) -> Path:
    device = result["device"].replace(" ", "-")
    spec = "" if result["options"]["speculative"] == "off" else f"-spec-{result['options']['speculative']}"
    return Path("bench/results") / f"engine-{device}-{result['commit'][:7]}{spec}.json"


def run(args: argparse.Namespace) -> int:
    try:
        plan, peer, options = prepare(args)
    except (ValueError, OSError) as exc:
        print(f"dsgraph bench engine: {exc}", file=sys.stderr)
        return 2
    result = result_of(args, plan, peer, options)
    out = Path(args.out) if args.out else default_out(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for batch, row in result.get("peer", {}).get("batches", {}).items():
        met = "met" if row["meets_target"] else "NOT met"
        print(
            f"batch {batch}: ours {row['ours_step_ms']:.3f} ms, vLLM {row['vllm_step_ms']:.3f} ms, "
            f"ratio {row['ratio']:.2f} (target <= 1: {met})"
        )
    print(f"wrote {out}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    defaults = EnginePlan()
    p.add_argument("--platform", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--model", choices=MODELS, default="bench", help="bench: 8 full-width layers; tiny: cpu")
    p.add_argument("--batches", default=",".join(map(str, defaults.batches)))
    p.add_argument("--prompt-len", type=int, default=defaults.prompt_len)
    p.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    p.add_argument("--steps", type=int, default=defaults.steps, help="timed engine steps per batch")
    p.add_argument("--diff-k", type=int, default=defaults.diff_k, help="extra tokens of the differencing")
    p.add_argument(
        "--profile-steps",
        type=int,
        default=defaults.profile_steps,
        help="steps per batch profiled after the timed ones: kernels, host phases, top functions (0: none)",
    )
    p.add_argument("--max-model-len", type=int, default=8192, help="the peer's default too")
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="prefill chunk (default: the engine's)"
    )
    p.add_argument(
        "--speculative",
        choices=["off", "auto", "dspark"],
        default="off",
        help="off (default): one token per request a step, as the peer runs; auto: the engine's default",
    )
    p.add_argument(
        "--overlap", choices=["auto", "on", "off"], default="auto", help="zero-overhead scheduling"
    )
    p.add_argument("--peer-json", default=None, help="vLLM's vllm_bench.json: adds ours / vLLM per batch")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/engine-DEVICE-COMMIT.json)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="decode step of the engine loop (batch 1 and 64), against vLLM's")
    add_arguments(p)
    p.set_defaults(func=run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
