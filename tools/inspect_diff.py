"""`dsgraph inspect --diff`: a unified diff of two dumps of one graph.

A side is `STAGE[@KEY=VALUE,...]` (a stage of the current graph: traced, optimized, specialized,
lowered, or all for every stage under its banner; KEY: tokens, seqs, pages override the bucket,
platform the platform to lower onto) or the path of a saved dump. With one side, the saved dump is
compared with the same dump of the current code (every stage, or `--stage`):

    dsgraph inspect --model DIR --step decode --diff traced optimized          # what the passes changed
    dsgraph inspect --model DIR --diff lowered@tokens=4 lowered@tokens=8       # two buckets
    dsgraph inspect --model DIR --diff lowered@platform=cpu lowered@platform=cuda
    dsgraph inspect --model DIR --stage lowered > before.txt    # then, after a change:
    dsgraph inspect --model DIR --stage lowered --diff before.txt

The exit status is 0 when the sides are equal, 1 when they differ (as diff(1)).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from dsgraph.graph import Graph
from dsgraph.tools.inspect_cmd import PLATFORMS, STAGES, bucket_sizes, dump, run_stages

SIDE_KEYS = ("tokens", "seqs", "pages", "platform")


def parse_side(side: str) -> tuple[str, dict[str, str]]:
    """`STAGE@k=v,...` -> (stage, overrides); errors name the side and what was expected."""
    stage, _, rest = side.partition("@")
    if stage not in (*STAGES, "all"):
        raise SystemExit(f"--diff {side}: {stage!r} is not a stage ({', '.join((*STAGES, 'all'))}) or a file")
    overrides: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in SIDE_KEYS:
            raise SystemExit(f"--diff {side}: {item!r}, expected KEY=VALUE with KEY one of {SIDE_KEYS}")
        if key != "platform" and not value.isdigit():
            raise SystemExit(f"--diff {side}: {key}={value!r}, expected a positive integer")
        if key == "platform" and value not in PLATFORMS:
            raise SystemExit(f"--diff {side}: platform={value!r}, expected one of {PLATFORMS}")
        overrides[key] = value
    return stage, overrides


def side_text(side: str, args: argparse.Namespace, graph: Graph, kind: str, block: int) -> str:
    """The dump a side names: a saved file's text, or a stage of the current graph."""
    if Path(side).is_file():
        return Path(side).read_text()
    stage, over = parse_side(side)
    tokens, pages = int(over.get("tokens", args.tokens)), int(over.get("pages", args.pages))
    seqs = int(over["seqs"]) if "seqs" in over else args.seqs
    sizes = bucket_sizes(graph.symbols, kind, tokens, seqs, pages, block)
    return dump(
        run_stages(graph, sizes), over.get("platform", args.platform), None if stage == "all" else stage
    )


def run_diff(args: argparse.Namespace, graph: Graph, kind: str, block: int) -> int:
    sides = list(args.diff)
    if len(sides) == 1:
        if not Path(sides[0]).is_file():
            raise SystemExit(
                f"--diff {sides[0]}: one side must be a saved dump file (two sides compare stages)"
            )
        sides.append(args.stage or "all")
    if len(sides) != 2:
        raise SystemExit(f"--diff: {len(sides)} sides given, expected one (a saved dump) or two")
    a, b = (side_text(s, args, graph, kind, block) for s in sides)
    diff = difflib.unified_diff(a.splitlines(True), b.splitlines(True), sides[0], sides[1], n=2)
    out = "".join(diff)
    print(out, end="")
    if not out:
        print(f"dsgraph inspect: {sides[0]} and {sides[1]} are equal", file=sys.stderr)
    return 1 if out else 0
