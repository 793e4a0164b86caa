"""`dsgraph generate`: greedy generation on a model directory, or on the embedded tiny random model."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_PROMPT = "w1 W2 w3 w4"


def default_model_dir() -> Path:
    """The embedded default: a tiny random checkpoint in the released format, made once per cache dir."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dsgraph" / "tiny-v41-seed0"
    if not (root / "config.json").exists():
        from dsgraph.models.deepseek_v41.tiny import make_tiny

        make_tiny(root, seed=0)
    return root


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text greedily (embedded tiny random model without --model)")
    p.add_argument("--model", help="model directory (config.json, tokenizer.json, safetensors)")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="a file with one prompt per line")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--numerics", choices=["serving", "reference"], default="serving")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.set_defaults(func=main)


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        prompts += [
            line.rstrip("\n") for line in Path(args.prompts_file).read_text().splitlines() if line.strip()
        ]
    return prompts or [DEFAULT_PROMPT]


def main(args: argparse.Namespace) -> int:
    from dsgraph.runtime.generate import greedy_generate
    from dsgraph.runtime.loader import load_runner

    if args.max_tokens < 1:
        raise SystemExit(f"--max-tokens: {args.max_tokens} must be >= 1")
    model_dir = Path(args.model) if args.model else default_model_dir()
    if not args.model:
        print(f"no --model given: using the embedded tiny model at {model_dir} (its weights are random)")
    runner, tokenizer = load_runner(model_dir, args.numerics, args.max_model_len)
    prompts = _prompts(args)
    ids = [tokenizer.encode(p).ids for p in prompts]
    try:
        gens, stats = greedy_generate(runner, ids, args.max_tokens, runner.model.cfg.eos_token_id)
    except ValueError as exc:
        print(f"dsgraph generate: {exc}", file=sys.stderr)
        return 2
    for prompt, gen in zip(prompts, gens, strict=True):
        print(f"prompt: {prompt!r}\noutput: {tokenizer.decode(gen.token_ids)!r} ({gen.finish_reason})")
    print(stats.line())
    return 0
