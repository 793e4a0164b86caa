"""The `dsgraph` command."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from dsgraph.tools import (
    bench_cmd,
    compile_cmd,
    generate_cmd,
    inspect_cmd,
    make_tiny_cmd,
    plan_cmd,
    router_cmd,
    serve_cmd,
    truncation_cmd,
)


def _version() -> str:
    try:
        return metadata.version("dsgraph")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsgraph", description="DeepSeek-V4.1 compiled-graph inference engine"
    )
    parser.add_argument("--version", action="version", version=f"dsgraph {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench_cmd.add_parser(sub)
    compile_cmd.add_parser(sub)
    generate_cmd.add_parser(sub)
    inspect_cmd.add_parser(sub)
    make_tiny_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    plan_cmd.add_parser(sub)
    truncation_cmd.add_parser(sub)
    router_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
