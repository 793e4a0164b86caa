"""`dsgraph make-tiny`: write a random checkpoint in the released layout."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected KEY=VALUE (VALUE as JSON)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-tiny",
        help="write a random V4.1 or V4 checkpoint (config.json, tokenizer.json, safetensors)",
    )
    p.add_argument("out", help="output directory")
    p.add_argument(
        "--model-type",
        choices=["deepseek_v41", "deepseek_v4"],
        default="deepseek_v41",
        help="DeepSeek-V4.1-Flash (default) or DeepSeek-V4-Flash",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", choices=["tiny", "deepseek"], default="tiny")
    p.add_argument(
        "--set",
        dest="overrides",
        type=_override,
        action="append",
        default=[],
        help="config override KEY=VALUE (V4.1: text_config or top-level key; V4: a config.json key; "
        "VALUE is JSON)",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.model_type == "deepseek_v4":
        from dsgraph.models.deepseek_v4.tiny import make_tiny as make_v4

        if args.tokenizer != "tiny":
            raise SystemExit(
                "make-tiny: --tokenizer deepseek is available for --model-type deepseek_v41 only"
            )
        out = make_v4(args.out, seed=args.seed, overrides=dict(args.overrides))
        print(f"wrote random DeepSeek-V4 checkpoint (seed {args.seed}, tiny tokenizer) to {out}")
        return 0
    from dsgraph.models.deepseek_v41.tiny import make_tiny

    out = make_tiny(args.out, seed=args.seed, overrides=dict(args.overrides), tokenizer=args.tokenizer)
    print(f"wrote random checkpoint (seed {args.seed}, {args.tokenizer} tokenizer) to {out}")
    return 0
