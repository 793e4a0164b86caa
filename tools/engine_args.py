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


# option -> (allowed values, or a type, or None for a bool switch; help). The flag is the option's name
# with dashes (vLLM's where _OPTION_OF says); the default is EngineConfig's.
_FLAGS: dict[str, tuple[Any, str | None]] = {
    "numerics": (ec.NUMERICS, None),
    "platform": (ec.PLATFORMS, "cuda: GPU kernels, graphs"),
    "max_model_len": (int, None),
    "max_num_seqs": (int, None),
    "max_num_batched_tokens": (int, "tokens per step (prefill chunk)"),
    "load_format": (
        ec.LOAD_FORMATS,
        "dummy: random weights from config.json alone, generated on the device (benchmarks)",
    ),
    "enable_prefix_cache": (None, "reuse the caches of earlier prompts' shared prefixes"),
    "prefix_replay": (
        ec.PREFIX_REPLAY,
        "exact: a hit gives a cold run's tokens; window: replays less, approximate (see README)",
    ),
    "prefill_truncation": (
        ec.TRUNCATION_MODES,
        "decoder layers run on each prompt's last tokens only: an approximation (see README)",
    ),
    "prefill_keep_tokens": (
        int,
        "prompt tokens the decoder layers keep (default: sliding_window + maximum backtrack)",
    ),
    "speculative": (
        ec.SPECULATIVE,
        "drafting with the checkpoint's own draft layers: dspark (V4.1's DSpark stages), mtp (V4's MTP "
        "layer); auto: on cuda when the checkpoint has them",
    ),
    "verify_schedule": (ec.VERIFY_SCHEDULES, None),
    "draft_len": (int, "fixed schedule: drafts verified per request"),
    "overlap": (ec.OVERLAP, "plan step N+1 while step N runs (auto: on with cuda)"),
    "engine_type": (
        ec.ENGINE_TYPES,
        "prefill/decode disaggregation: prompt prefills and hands off, completion decodes (README)",
    ),
    "bundle": (
        str,
        "start from an ahead-of-time bundle of `dsgraph compile` (no tracing or kernel compiling)",
    ),
    "capture": (None, "cuda: replay each bucket from CUDA graphs (--no-capture: run eagerly, for debugging)"),
    "capture_max_tokens": (int, "cuda: buckets of more tokens (long prefill chunks) run eagerly"),
}


def add_engine_args(p: argparse.ArgumentParser) -> None:
    defaults = ec.EngineConfig().flat()
    flag_of = {option: dest for dest, option in _OPTION_OF.items()}
    for option, (kind, text) in _FLAGS.items():
        flag = "--" + flag_of.get(option, option).replace("_", "-")
        if kind is None:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=defaults[option], help=text)
        elif isinstance(kind, tuple):
            p.add_argument(flag, choices=kind, default=defaults[option], help=text)
        else:
            p.add_argument(flag, type=kind, default=defaults[option], help=text)
    # a plain switch (store_true): off is its default and needs no --no- form
    p.add_argument(
        "--deterministic", action="store_true", help="tokens independent of batch and drafting (seeded)"
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig options (flat names, `EngineConfig.from_flat`) from the parsed flags: every flag whose
    destination is an option's name (or vLLM's name for it)."""
    options = {_OPTION_OF.get(dest, dest): value for dest, value in vars(args).items()}
    return {name: value for name, value in options.items() if name in ec.FLAT}
