"""`dsgraph compile`: an ahead-of-time bundle for one cluster shape and configuration (docs/bundle.md).
It takes the engine flags of `generate` and `serve`; those that change compiled output are recorded in
the manifest, and a run with `--bundle` must give the same ones."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dsgraph.tools.engine_args import add_engine_args, engine_kwargs


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="compile an ahead-of-time bundle (graphs, kernels, tuned tables)")
    p.add_argument("--model", help="model directory (default: the embedded tiny model)")
    p.add_argument("--out", required=True, help="the bundle folder to create (must not exist or be empty)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel ranks the bundle is for")
    p.add_argument("--extra-experts", type=int, default=None, help="redundant experts per MoE (with --ep)")
    add_engine_args(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from dsgraph.runtime.bundle.compile import compile_bundle
    from dsgraph.runtime.bundle.describe import describe
    from dsgraph.runtime.engine_config import EngineConfig

    kwargs = engine_kwargs(args)
    if kwargs.pop("bundle"):
        print("dsgraph compile: --bundle is what a run reads; compile writes --out", file=sys.stderr)
        return 2
    try:
        config = EngineConfig.from_flat(**kwargs)
        compile_bundle(
            args.model and Path(args.model),
            config,
            Path(args.out),
            ep=args.ep,
            extra_experts=args.extra_experts,
        )
    except ValueError as exc:
        print(f"dsgraph compile: {exc}", file=sys.stderr)
        return 2
    print(describe(args.out), end="")
    return 0


def inspect_bundle(path: str, program: str | None) -> int:
    """`dsgraph inspect --bundle PATH [--program KIND/BUCKET]`."""
    from dsgraph.runtime.bundle.describe import describe, program_text

    try:
        if program is None:
            print(describe(path), end="")
        else:
            kind, _, bucket = program.partition("/")
            print(program_text(path, kind, bucket), end="")
    except ValueError as exc:
        print(f"dsgraph inspect: {exc}", file=sys.stderr)
        return 2
    return 0
