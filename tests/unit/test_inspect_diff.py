"""`dsgraph inspect --diff` (two stages, two buckets, two platforms, a dump against a saved one) and
`--platform cuda` (lowered without a GPU, naming each op's kernels)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dsgraph.tools.cli import main
from dsgraph.tools.inspect_cmd import bucket_sizes

EXAMPLE = ["inspect", "--example", "--tokens", "4"]


def test_two_buckets_differ_in_their_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXAMPLE, "--diff", "specialized@tokens=4", "specialized@tokens=8"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("--- specialized@tokens=4\n+++ specialized@tokens=8\n")
    assert "-graph example_step[tokens=4]" in out and "+graph example_step[tokens=8]" in out


def test_a_stage_equals_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXAMPLE, "--diff", "lowered", "lowered@tokens=4,platform=null"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "are equal" in captured.err


def test_two_platforms_differ_in_their_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXAMPLE, "--diff", "lowered@platform=null", "lowered@platform=cpu"]) == 1
    out = capsys.readouterr().out
    assert (
        "-  [0] rms_norm         -> null.target.launch" in out
        and "+  [0] rms_norm         -> rules_core.rms_norm" in out
    )


def test_a_saved_dump_against_the_current_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXAMPLE, "--stage", "lowered"]) == 0
    saved = tmp_path / "lowered.txt"
    saved.write_text(capsys.readouterr().out)
    assert main([*EXAMPLE, "--stage", "lowered", "--diff", str(saved)]) == 0
    saved.write_text(saved.read_text().replace("arena", "arena!", 1))
    capsys.readouterr()
    assert main([*EXAMPLE, "--stage", "lowered", "--diff", str(saved)]) == 1
    assert "-memory plan" in capsys.readouterr().out
    assert main([*EXAMPLE, "--diff", str(saved), "lowered"]) == 1  # a file as either side


@pytest.mark.parametrize(
    ("side", "message"),
    [
        ("compiled", "'compiled' is not a stage"),
        ("lowered@tokens", "expected KEY=VALUE"),
        ("lowered@batch=2", "expected KEY=VALUE with KEY one of"),
        ("lowered@tokens=two", "expected a positive integer"),
        ("lowered@platform=tpu", "platform='tpu', expected one of"),
    ],
)
def test_a_bad_side_is_named(side: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        main([*EXAMPLE, "--diff", "lowered", side])


def test_one_side_must_be_a_file() -> None:
    with pytest.raises(SystemExit, match="one side must be a saved dump file"):
        main([*EXAMPLE, "--diff", "lowered"])


def test_bucket_sizes_of_each_step_kind() -> None:
    symbols = frozenset({"tokens", "seqs", "outs", "slots", "blocks1"})
    assert bucket_sizes(symbols, "decode", 4, None, 3) == {
        "tokens": 4,
        "seqs": 4,
        "outs": 4,
        "slots": 4,
        "blocks1": 3,
    }
    assert bucket_sizes(symbols, "prefill", 8, None, 3)["seqs"] == 1
    assert bucket_sizes(symbols, "verify", 6, 2, 3) == {
        "tokens": 6,
        "seqs": 2,
        "outs": 6,
        "slots": 2,
        "blocks1": 3,
    }
    draft = frozenset({"tokens", "seqs", "slots"})
    assert bucket_sizes(draft, "draft", 8, 2, 3, block=5) == {"tokens": 10, "seqs": 2, "slots": 2}


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_cuda_lowers_without_a_gpu_and_names_the_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EXAMPLE, "--platform", "cuda", "--stage", "lowered"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("program example_step[tokens=4] on cuda")
    assert "linear           -> cuda.kernels.linear.linear  launches: moe_swap_tl.qdq_rows_kernel" in out
