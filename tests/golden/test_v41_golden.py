"""Process replay: the tiny V4.1 prefill, decode, verify and draft graphs (and the sampler's) at every
stage, and their programs on `null` and `cpu`, equal the dumps committed under tests/golden/v41/ (the
`cuda` programs: tests/cuda/test_cuda_program_golden.py).

A change to what the model traces, to a pass, to specialization or to which rule an op lowers to shows
up here as a diff; a refactor that leaves every dump unchanged is output-neutral for these graphs. If a
change is intended: `pytest tests/golden --update-goldens`, then review and commit the diff.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from dsgraph.tools.graph_dumps import golden_dumps, golden_names
from tests.golden.check import check_golden

V41 = Path(__file__).parent / "v41"


@cache
def _dumps() -> dict[str, str]:
    return golden_dumps()


@pytest.mark.parametrize("name", golden_names())
def test_dump_matches_golden(name: str, update_goldens: bool) -> None:
    check_golden(V41 / name, _dumps()[name], update_goldens)


def test_no_stale_golden_files(update_goldens: bool) -> None:
    """Every committed dump is one the code still produces (a renamed stage leaves no orphan behind)."""
    # the cuda programs are tests/cuda/test_cuda_program_golden.py's, the captured ones the GPU test's
    known = set(golden_names(("null", "cpu", "cuda")))
    stale = sorted(
        name
        for name in (str(p.relative_to(V41)) for p in V41.rglob("*.txt"))
        if name not in known and not name.startswith("gpu/")
    )
    if update_goldens and stale:
        for name in stale:
            (V41 / name).unlink()
        pytest.skip(f"--update-goldens: removed {stale}")
    assert not stale, f"golden files no stage produces any more: {stale} (remove them with --update-goldens)"


def test_every_kind_and_platform_is_dumped() -> None:
    names = set(golden_names())
    for bucket in ("step/prefill", "step/decode", "step_dspark/verify", "draft/draft"):
        for stage in ("specialized", "null", "cpu"):
            assert f"{bucket}.{stage}.txt" in names, f"{bucket}.{stage}"
    for graph in ("step", "step_dspark", "draft", "sample", "spec_verify"):
        assert {f"{graph}/{s}.txt" for s in ("traced", "cse", "dce")} <= names, graph


def test_the_names_are_the_dumps() -> None:
    assert sorted(_dumps()) == sorted(golden_names())
