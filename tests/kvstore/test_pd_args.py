"""`dsgraph serve` PD flags: --engine-type reaches EngineConfig, bad combinations name the flag."""

from __future__ import annotations

import pytest

from dsgraph.runtime.engine_config import EngineConfig
from dsgraph.tools.cli import build_parser
from dsgraph.tools.engine_args import engine_kwargs
from dsgraph.tools.pd_args import check_pd_args, store_from_args


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["serve", *argv])


def test_engine_type_and_store_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = _args("--engine-type", "completion", "--kv-store-path", str(tmp_path), "--kv-store-ttl", "60")
    check_pd_args(args)
    assert EngineConfig.from_flat(**engine_kwargs(args)).engine_type == "completion"
    store = store_from_args(args)
    assert store.config.disk_ttl_s == 60 and store.disk is not None
    assert store_from_args(_args()) is None


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--engine-type", "prompt"), "--engine-type prompt needs --pd-peer"),
        (("--pd-peer", "http://127.0.0.1:1"), "--pd-peer is for --engine-type prompt"),
        (("--engine-type", "completion", "--ep", "2"), "runs on one engine"),
    ],
)
def test_bad_combinations_name_the_flag(argv: tuple[str, ...], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        check_pd_args(_args(*argv))


def test_generate_refuses_a_pd_engine_type(capsys) -> None:  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(["generate", "--engine-type", "prompt", "--prompt", "W1"])
    assert args.func(args) == 2
    assert "generate runs a normal engine" in capsys.readouterr().err
