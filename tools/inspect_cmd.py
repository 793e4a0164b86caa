"""`dsgraph inspect`: print a step's graph at every stage (traced, optimized, specialized, planned)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dsgraph.graph import Graph, TensorType, format_graph, make_graph, verify
from dsgraph.graph.passes import cse, dce, specialize
from dsgraph.platform.registry import lower


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
    optimized = verify(dce(cse(graph)))
    return Stages(graph, optimized, verify(specialize(optimized, sizes)))


def _banner(title: str) -> str:
    return f"==== {title} " + "=" * max(0, 60 - len(title))


def dump(stages: Stages, platform: str) -> str:
    program = lower(stages.specialized, platform)
    parts = [
        _banner("traced"),
        format_graph(stages.traced),
        _banner("optimized (cse, dce)"),
        format_graph(stages.optimized),
        _banner(f"specialized to bucket {stages.specialized.name}"),
        format_graph(stages.specialized),
        _banner(f"lowered and memory-planned on {platform}"),
        program.as_text(),
    ]
    return "\n".join(parts)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print a step's graph at each stage")
    p.add_argument("--example", action="store_true", help="use the built-in example function")
    p.add_argument("--model", help="model directory (config.json); traces the model's step")
    p.add_argument("--step", default="decode", help="step kind to trace (with --model)")
    p.add_argument("--tokens", type=int, default=8, help="bucket size for the symbolic token dim")
    p.add_argument("--seqs", type=int, default=None, help="bucket size for the symbolic sequence dim")
    p.add_argument(
        "--pages", type=int, default=16, help="cache pages per compressed-cache pool (with --model)"
    )
    p.add_argument("--platform", default="null", choices=["null", "cpu"], help="platform to lower onto")
    p.set_defaults(func=main)


def bucket_sizes(
    symbols: frozenset[str], kind: str, tokens: int, seqs: int | None, pages: int
) -> dict[str, int]:
    """Concrete sizes for a dump: decode has one row per sequence, prefill one sequence by default."""
    seqs = seqs or (tokens if kind in ("decode", "example") else 1)
    rows = seqs if kind == "decode" else tokens
    sizes = {"tokens": rows, "seqs": seqs, "outs": seqs, "slots": seqs}
    sizes.update({s: pages for s in symbols if s.startswith("blocks")})
    return {k: v for k, v in sizes.items() if k in symbols}


def main(args: argparse.Namespace) -> int:
    if args.model:
        from dsgraph.tools.model_graphs import trace_model_step

        graph = trace_model_step(args.model, args.step)
    elif args.example:
        graph = example_graph()
    else:
        raise SystemExit("dsgraph inspect: give --example or --model DIR")
    sizes = bucket_sizes(
        graph.symbols, args.step if args.model else "example", args.tokens, args.seqs, args.pages
    )
    print(dump(run_stages(graph, sizes), args.platform), end="")
    return 0
