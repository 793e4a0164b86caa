"""The engine options `generate` and `serve` share: everything that shapes decoding is set the same way
on both (EngineConfig fields, vLLM's flag names where they exist)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_engine_args", "engine_kwargs"]


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--numerics", choices=["serving", "reference"], default="serving")
    p.add_argument("--platform", choices=["cpu", "cuda"], default="cpu", help="cuda: GPU kernels, graphs")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=256, help="tokens per step (prefill chunk)")
    p.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default="auto",
        help="dummy: random weights from config.json alone, generated on the device (benchmarks)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the caches of earlier prompts' shared prefixes",
    )
    p.add_argument(
        "--prefix-replay",
        choices=["exact", "window"],
        default="exact",
        help="exact: a hit gives a cold run's tokens; window: replays less, approximate (see README)",
    )
    p.add_argument(
        "--prefill-truncation",
        choices=["off", "mask", "compact"],
        default="off",
        help="decoder layers run on each prompt's last tokens only: an approximation (see README)",
    )
    p.add_argument(
        "--prefill-keep-tokens",
        type=int,
        default=None,
        help="prompt tokens the decoder layers keep (default: sliding_window + maximum backtrack)",
    )
    p.add_argument(
        "--speculative",
        choices=["auto", "dspark", "mtp", "off"],
        default="auto",
        help="drafting with the checkpoint's own draft layers: dspark (V4.1's DSpark stages), mtp (V4's "
        "MTP layer); auto: on cuda when the checkpoint has them",
    )
    p.add_argument("--verify-schedule", choices=["confidence", "fixed"], default="confidence")
    p.add_argument("--draft-len", type=int, default=None, help="fixed schedule: drafts verified per request")
    p.add_argument(
        "--deterministic", action="store_true", help="tokens independent of batch and drafting (seeded)"
    )
    p.add_argument(
        "--overlap",
        choices=["auto", "on", "off"],
        default="auto",
        help="plan step N+1 while step N runs (auto: on with cuda when not drafting)",
    )
    p.add_argument(
        "--engine-type",
        choices=["normal", "prompt", "completion"],
        default="normal",
        help="prefill/decode disaggregation: prompt prefills and hands off, completion decodes (README)",
    )
    p.add_argument(
        "--bundle",
        default=None,
        help="start from an ahead-of-time bundle of `dsgraph compile` (no tracing or kernel compiling)",
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig keyword arguments from the parsed flags."""
    return {
        "numerics": args.numerics,
        "platform": args.platform,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "load_format": args.load_format,
        "enable_prefix_cache": args.enable_prefix_caching,
        "prefix_replay": args.prefix_replay,
        "prefill_truncation": args.prefill_truncation,
        "prefill_keep_tokens": args.prefill_keep_tokens,
        "speculative": args.speculative,
        "verify_schedule": args.verify_schedule,
        "draft_len": args.draft_len,
        "deterministic": args.deterministic,
        "overlap": args.overlap,
        "engine_type": args.engine_type,
        "bundle": args.bundle,
    }
