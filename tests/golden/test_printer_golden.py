"""Printed graphs equal the golden files. Regenerate with DSGRAPH_REGEN_GOLDEN=1; the diff is the review."""

from __future__ import annotations

import os
import pathlib

import pytest

from dsgraph.graph import format_graph, verify
from tests.golden import graphs

HERE = pathlib.Path(__file__).parent
DATA = HERE / "data"


GOLDEN = graphs.GOLDEN


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_printed_graph_matches_golden(name: str) -> None:
    text = format_graph(verify(GOLDEN[name]()))
    path = DATA / f"{name}.txt"
    if os.environ.get("DSGRAPH_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with DSGRAPH_REGEN_GOLDEN=1 once"
    assert text == path.read_text()


def test_printing_is_stable_across_traces() -> None:
    for make in GOLDEN.values():
        assert format_graph(make()) == format_graph(make())
