"""`dsgraph inspect`: print a step's graph at every stage (traced, optimized, specialized, lowered), or
the diff of two stages, two buckets, or a dump against a saved one (`--diff`, `tools/inspect_diff.py`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dsgraph.graph import Graph, TensorType, format_graph, make_graph, verify
from dsgraph.graph.passes import optimize, specialize
from dsgraph.platform.registry import lower

STAGES = ("traced", "optimized", "specialized", "lowered")
PLATFORMS = ("null", "cpu", "cuda")


@dataclass(frozen=True)
class Stages:
    traced: Graph
    optimized: Graph
    specialized: Graph


def example_step(x, norm_w, w_up, w_down):  # type: ignore[no-untyped-def]
    """A small MLP block over symbolic `tokens`: the built-in example before a model is given."""
    from dsgraph.ops import core as C
    from dsgraph.ops import nn as N

    h = N.rms_norm(x, norm_w, eps=1e-6)
    up = N.linear(h, w_up, out_dtype="f32")
    act = C.silu(up) * up
    return {"y": x + N.linear(act, w_down, out_dtype="f32")}


def example_graph() -> Graph:
    return make_graph(
        example_step,
        TensorType(("tokens", 64), "f32"),
        TensorType((64,), "f32"),
        TensorType((128, 64), "f32"),
        TensorType((64, 128), "f32"),
    )


def run_stages(graph: Graph, sizes: dict[str, int]) -> Stages:
    verify(graph)
    optimized = verify(optimize(graph))
    return Stages(graph, optimized, verify(specialize(optimized, sizes)))


def _banner(title: str) -> str:
    return f"==== {title} " + "=" * max(0, 60 - len(title))


def stage_texts(stages: Stages, platform: str) -> dict[str, tuple[str, str]]:
    """Stage name -> (banner title, text), in pipeline order."""
    program = lower(stages.specialized, platform)
    return {
        "traced": ("traced", format_graph(stages.traced)),
        "optimized": ("optimized (cse, dce)", format_graph(stages.optimized)),
        "specialized": (f"specialized to bucket {stages.specialized.name}", format_graph(stages.specialized)),
        "lowered": (f"lowered and memory-planned on {platform}", program.as_text()),
    }


def dump(stages: Stages, platform: str, only: str | None = None) -> str:
    """Every stage under its banner, or the text of stage `only` alone."""
    texts = stage_texts(stages, platform)
    if only is not None:
        return texts[only][1]
    return "\n".join(f"{_banner(title)}\n{text}" for title, text in texts.values())


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print a step's graph at each stage, or diff two of them")
    p.add_argument("--example", action="store_true", help="use the built-in example function")
    p.add_argument("--bundle", help="describe a bundle of `dsgraph compile` (buckets, kernels, manifest)")
    p.add_argument(
        "--program",
        metavar="KIND/BUCKET",
        help="with --bundle: one bucket's lowered program (step/tokens8-seqs2-outs4)",
    )
    p.add_argument("--model", help="model directory (config.json); traces the model's step")
    p.add_argument(
        "--step", default="decode", help="step kind with --model: decode, prefill, verify or draft"
    )
    p.add_argument("--tokens", type=int, default=8, help="bucket size for the symbolic token dim")
    p.add_argument("--seqs", type=int, default=None, help="bucket size for the symbolic sequence dim")
    p.add_argument(
        "--pages", type=int, default=16, help="cache pages per compressed-cache pool (with --model)"
    )
    p.add_argument(
        "--platform",
        default="null",
        choices=PLATFORMS,
        help="platform to lower onto; cuda lowers without a GPU and names each op's kernel",
    )
    p.add_argument("--stage", choices=STAGES, help="print only this stage")
    p.add_argument(
        "--kernels",
        action="store_true",
        help="count the kernels one cuda step launches, per op and per layer, without a GPU (decode: "
        "--seqs requests at --context, default --tokens requests; prefill: a --tokens chunk; draft, "
        "draft_greedy: a DSpark draft pass for --seqs requests, full graph or greedy variant, per "
        "stage); without --model the bench model (8 full-width layers)",
    )
    p.add_argument("--context", type=int, default=8192, help="with --kernels: the decode context length")
    p.add_argument("--json", action="store_true", help="with --kernels: JSON instead of the table")
    p.add_argument("--by-layer", action="store_true", help="with --kernels: each layer's launches per op too")
    p.add_argument(
        "--diff",
        nargs="+",
        metavar="SIDE",
        help="diff two sides, each STAGE[@KEY=N,...] (KEY: tokens, seqs, pages, platform=NAME) or a "
        "saved dump FILE; one side: FILE against the current dump. Exit status 1 when they differ",
    )
    p.set_defaults(func=main)


def bucket_sizes(
    symbols: frozenset[str], kind: str, tokens: int, seqs: int | None, pages: int, block: int = 1
) -> dict[str, int]:
    """Concrete sizes for a dump: decode and draft have one row per sequence (draft: `block` rows), prefill
    one sequence by default, verify `tokens` rows over `seqs` sequences; every row's logits for verify."""
    seqs = seqs or (tokens if kind in ("decode", "example", "draft") else 1)
    rows = {"decode": seqs, "draft": seqs * block}.get(kind, tokens)
    outs = rows if kind == "verify" else seqs
    sizes = {"tokens": rows, "seqs": seqs, "outs": outs, "slots": seqs}
    sizes.update({s: pages for s in symbols if s.startswith("blocks")})
    return {k: v for k, v in sizes.items() if k in symbols}


def load_graph(args: argparse.Namespace) -> tuple[Graph, str, int]:
    """The graph to inspect, its step kind and the draft block size (1 unless drafting)."""
    if args.model:
        from dsgraph.models.registry import family_for
        from dsgraph.tools.model_graphs import trace_model_step

        family = family_for(args.model)
        block = (
            family.drafting.num_tokens(family.load_config(Path(args.model))) if args.step == "draft" else 1
        )
        return trace_model_step(args.model, args.step), args.step, block
    if args.example:
        return example_graph(), "example", 1
    raise SystemExit("dsgraph inspect: give --example or --model DIR")


def kernel_census(args: argparse.Namespace) -> int:
    """The census runs in a child process: Triton's interpreter must be on before triton is imported."""
    import subprocess
    import sys

    from dsgraph.platform.env import child_environ
    from dsgraph.tools.kernel_census import STEPS

    if args.step not in STEPS:
        raise SystemExit(f"dsgraph inspect --kernels: --step {args.step!r}: expected one of {STEPS}")
    batch = args.tokens if args.step == "prefill" else (args.seqs or args.tokens)
    cmd = [sys.executable, "-m", "dsgraph.tools.kernel_census", "--step", args.step, "--batch", str(batch)]
    cmd += ["--context", str(args.context), *(["--model", args.model] if args.model else [])]
    cmd += ["--json"] if args.json else []
    cmd += ["--by-layer"] if args.by_layer else []
    return subprocess.run(cmd, env=child_environ(TRITON_INTERPRET="1"), check=False).returncode


def main(args: argparse.Namespace) -> int:
    if args.kernels:
        return kernel_census(args)
    if args.bundle:
        from dsgraph.tools.compile_cmd import inspect_bundle

        return inspect_bundle(args.bundle, args.program)
    graph, kind, block = load_graph(args)
    if args.diff:
        from dsgraph.tools.inspect_diff import run_diff

        return run_diff(args, graph, kind, block)
    sizes = bucket_sizes(graph.symbols, kind, args.tokens, args.seqs, args.pages, block)
    print(dump(run_stages(graph, sizes), args.platform, args.stage), end="")
    return 0
