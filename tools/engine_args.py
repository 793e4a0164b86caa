"""The engine options `generate`, `serve` and `compile` share: everything that shapes decoding is set the
same way on each (EngineConfig's flat option names, vLLM's flag names where they exist). Defaults and
allowed values are EngineConfig's own (runtime/engine_config.py), so a flag cannot default differently
from `LLM()`; the config validates the values."""

from __future__ import annotations

import argparse
from typing import Any

from dsgraph.runtime import engine_config as ec

__all__ = ["add_engine_args", "engine_kwargs"]

# flag dest -> EngineConfig option, where the flag has vLLM's name
_OPTION_OF = {"enable_prefix_caching": "enable_prefix_cache"}


def add_engine_args(p: argparse.ArgumentParser) -> None:
    d = ec.EngineConfig().flat()
    p.add_argument("--numerics", choices=ec.NUMERICS, default=d["numerics"])
    p.add_argument(
        "--platform", choices=ec.PLATFORMS, default=d["platform"], help="cuda: GPU kernels, graphs"
    )
    p.add_argument("--max-model-len", type=int, default=d["max_model_len"])
    p.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"])
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=d["max_num_batched_tokens"],
        help="tokens per step (prefill chunk)",
    )
    p.add_argument(
        "--load-format",
        choices=ec.LOAD_FORMATS,
        default=d["load_format"],
        help="dummy: random weights from config.json alone, generated on the device (benchmarks)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=d["enable_prefix_cache"],
        help="reuse the caches of earlier prompts' shared prefixes",
    )
    p.add_argument(
        "--prefix-replay",
        choices=ec.PREFIX_REPLAY,
        default=d["prefix_replay"],
        help="exact: a hit gives a cold run's tokens; window: replays less, approximate (see README)",
    )
    p.add_argument(
        "--prefill-truncation",
        choices=ec.TRUNCATION_MODES,
        default=d["prefill_truncation"],
        help="decoder layers run on each prompt's last tokens only: an approximation (see README)",
    )
    p.add_argument(
        "--prefill-keep-tokens",
        type=int,
        default=d["prefill_keep_tokens"],
        help="prompt tokens the decoder layers keep (default: sliding_window + maximum backtrack)",
    )
    p.add_argument(
        "--speculative",
        choices=ec.SPECULATIVE,
        default=d["speculative"],
        help="DSpark drafting (auto: on cuda when the checkpoint has DSpark stages)",
    )
    p.add_argument("--verify-schedule", choices=ec.VERIFY_SCHEDULES, default=d["verify_schedule"])
    p.add_argument(
        "--draft-len", type=int, default=d["draft_len"], help="fixed schedule: drafts verified per request"
    )
    p.add_argument(
        "--deterministic", action="store_true", help="tokens independent of batch and drafting (seeded)"
    )
    p.add_argument(
        "--overlap",
        choices=ec.OVERLAP,
        default=d["overlap"],
        help="plan step N+1 while step N runs (auto: on with cuda)",
    )
    p.add_argument(
        "--engine-type",
        choices=ec.ENGINE_TYPES,
        default=d["engine_type"],
        help="prefill/decode disaggregation: prompt prefills and hands off, completion decodes (README)",
    )
    p.add_argument(
        "--bundle",
        default=d["bundle"],
        help="start from an ahead-of-time bundle of `dsgraph compile` (no tracing or kernel compiling)",
    )
    p.add_argument(
        "--capture",
        action=argparse.BooleanOptionalAction,
        default=d["capture"],
        help="cuda: replay each bucket from CUDA graphs (--no-capture: run eagerly, for debugging)",
    )
    p.add_argument(
        "--capture-max-tokens",
        type=int,
        default=d["capture_max_tokens"],
        help="cuda: buckets of more tokens (long prefill chunks) run eagerly",
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig options (flat names, `EngineConfig.from_flat`) from the parsed flags: every flag whose
    destination is an option's name (or vLLM's name for it)."""
    options = {_OPTION_OF.get(dest, dest): value for dest, value in vars(args).items()}
    return {name: value for name, value in options.items() if name in ec.FLAT}
