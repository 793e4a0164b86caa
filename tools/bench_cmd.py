"""`dsgraph bench`: calibrate the GPU, time kernels side by side and the full-width model's prefill and
decode steps, write JSON and the decode Pareto plots (`--plot FILE` redraws the plots of a saved run).
`dsgraph bench serve`: online load against a running server (tools/bench/serve_bench.py, its arguments
in serve_args.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PARTS = ("kernels", "model", "spec", "prefill", "overlap")


def _plans(quick: bool, budget_s: float):  # type: ignore[no-untyped-def]
    from dsgraph.tools.bench.model_bench import Plan

    if not quick:
        return Plan(budget_s=budget_s)
    return Plan(prefill_chunks=(4096,), decode_batches=(1, 64), decode_contexts=(8192,), budget_s=budget_s)


def write_plots(result_path: Path) -> list[Path]:
    from dsgraph.tools.bench.plot import pareto_svg

    result = json.loads(result_path.read_text())
    model = result.get("model", {})
    gpu = result["env"]["gpu"]
    out = []
    for name, rows, key, title in (
        ("measured", model.get("decode", []), "tokens_per_s_per_gpu", f"decode, 8 measured layers, {gpu}"),
        (
            "extrapolated",
            model.get("extrapolated_40_layers", {}).get("decode", []),
            "tokens_per_s_40_layer_cost",
            f"decode, 40 layers EXTRAPOLATED, {gpu}",
        ),
    ):
        path = result_path.with_name(result_path.stem + f"-pareto-{name}.svg")
        path.write_text(pareto_svg(rows, key, title))
        out.append(path)
    return out


def run(args: argparse.Namespace) -> int:
    if args.plot:
        for p in write_plots(Path(args.plot)):
            print(f"wrote {p}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("dsgraph bench: no CUDA device (the bench measures a GPU; see bench/ for committed results)")
        return 2
    from dsgraph.tools.bench.run import run_bench

    parts = tuple(p for p in args.parts.split(",") if p)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"dsgraph bench: unknown --parts {unknown}; known: {list(PARTS)}")
        return 2
    path = run_bench(Path(args.out), _plans(args.quick, args.budget_s), parts)
    print(f"wrote {path}")
    for p in write_plots(path):
        print(f"wrote {p}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark kernels and model steps on the GPU (JSON + plots)")
    p.add_argument("--out", default="bench/results", help="folder for the JSON and SVG files")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {PARTS}")
    p.add_argument("--quick", action="store_true", help="a few cases only (smoke run)")
    p.add_argument(
        "--budget-s", type=float, default=420.0, help="wall-clock seconds after which model cases are skipped"
    )
    p.add_argument("--plot", metavar="JSON", help="only redraw the plots of a saved result")
    p.set_defaults(func=run)
    from dsgraph.tools.bench import bundle_start, engine_cmd, router_sim_cmd, serve_args, v4_bench

    modes = p.add_subparsers(dest="mode", metavar="MODE")
    serve_args.add_parser(modes)
    v4_bench.add_parser(modes)
    router_sim_cmd.add_parser(modes)
    bundle_start.add_parser(modes)
    engine_cmd.add_parser(modes)
