"""`generate` and `serve` share every option that shapes decoding; an absent platform is one clear line."""

from __future__ import annotations

import argparse

import pytest

from dsgraph.tools.cli import build_parser, main
from dsgraph.tools.engine_args import engine_kwargs

# generate's per-run sampling and input flags: a server takes these per request instead
SAMPLING_OR_INPUT = {
    "prompt",
    "prompts_file",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
}


def _dests(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in sub.choices[command]._actions} - {"help", "func"}


def test_serve_has_every_decoding_option_of_generate() -> None:
    missing = _dests("generate") - SAMPLING_OR_INPUT - _dests("serve")
    assert not missing, f"serve lacks generate's {sorted(missing)}"
    assert {
        "speculative",
        "deterministic",
        "enable_prefix_caching",
        "prefix_replay",
        "load_format",
    } <= _dests("serve")


def test_flags_map_onto_engine_config() -> None:
    from dsgraph.runtime.engine import EngineConfig

    args = build_parser().parse_args(
        [
            "serve",
            "--no-enable-prefix-caching",
            "--prefix-replay",
            "window",
            "--load-format",
            "dummy",
            "--deterministic",
            "--speculative",
            "off",
            "--max-num-batched-tokens",
            "64",
        ]
    )
    cfg = EngineConfig.from_flat(**engine_kwargs(args))
    assert (cfg.cache.enable_prefix_cache, cfg.cache.prefix_replay, cfg.load.format) == (
        False,
        "window",
        "dummy",
    )
    assert (cfg.speculative.deterministic, cfg.speculative.mode) == (True, "off")
    assert cfg.scheduler.max_num_batched_tokens == 64
    default = EngineConfig.from_flat(**engine_kwargs(build_parser().parse_args(["generate"])))
    assert default.cache.prefix_replay == "exact" and default.cache.enable_prefix_cache


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_cuda_without_a_gpu_is_one_clear_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main([command, "--platform", "cuda"]) == 2
    err = capsys.readouterr().err
    assert f"dsgraph {command}: platform: 'cuda' is not available here" in err and "Traceback" not in err
