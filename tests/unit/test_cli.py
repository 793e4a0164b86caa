"""The `dsgraph` command: --version and `inspect --example`."""

from __future__ import annotations

import pytest

from dsgraph.tools.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("dsgraph ")


@pytest.mark.parametrize("platform", ["null", "cpu"])
def test_inspect_example_prints_every_stage(capsys: pytest.CaptureFixture[str], platform: str) -> None:
    assert main(["inspect", "--example", "--tokens", "4", "--platform", platform]) == 0
    out = capsys.readouterr().out
    stages = ["==== traced", "==== optimized", "==== specialized to bucket", f"==== lowered and memory-planned on {platform}"]
    positions = [out.index(s) for s in stages]
    assert positions == sorted(positions)
    assert "f32[tokens,64]" in out and "f32[4,64]" in out
    assert "arena" in out and "peak live" in out


def test_inspect_needs_a_source() -> None:
    with pytest.raises(SystemExit, match="give --example or --model"):
        main(["inspect"])
