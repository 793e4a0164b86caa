"""The arguments of `dsgraph bench serve` (tools/bench/serve_bench.py runs it). Kept apart so that
`dsgraph bench` parses without the load generator's HTTP client installed (a GPU machine that only runs
the kernel and model parts)."""

from __future__ import annotations

import argparse

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="online load against an OpenAI-compatible server (like vllm bench serve)"
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument(
        "--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"]
    )
    p.add_argument("--model", help="the model name to send (default: the server's first /v1/models entry)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument(
        "--request-rate", default="inf", help="requests/s, Poisson arrivals; comma list for a sweep"
    )
    p.add_argument("--max-concurrency", default="", help="requests in flight at most; comma list for a sweep")
    p.add_argument("--input-len", type=int, default=256, help="random dataset: prompt tokens")
    p.add_argument("--output-len", type=int, default=64, help="output tokens (max_tokens, with ignore_eos)")
    p.add_argument(
        "--range-ratio", type=float, default=0.0, help="random lengths uniform in len*(1 +- ratio)"
    )
    p.add_argument("--vocab-size", type=int, default=256, help="random token ids are drawn from [3, this)")
    p.add_argument("--dataset", help="JSONL file of {'prompt': text, 'max_tokens': k} instead of random ids")
    p.add_argument("--percentiles", default="50,90,99")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/serve", help="folder for serve-<time>.json and its plot")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from dsgraph.tools.bench.serve_bench import main

    return main(args)
