"""Printed graphs equal the golden files. Regenerate with `--update-goldens`; the diff is the review."""

from __future__ import annotations

import pathlib

import pytest

from dsgraph.graph import format_graph, verify
from tests.golden import graphs
from tests.golden.check import check_golden

HERE = pathlib.Path(__file__).parent
DATA = HERE / "data"


GOLDEN = graphs.GOLDEN


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_printed_graph_matches_golden(name: str, update_goldens: bool) -> None:
    check_golden(DATA / f"{name}.txt", format_graph(verify(GOLDEN[name]())), update_goldens)


def test_printing_is_stable_across_traces() -> None:
    for make in GOLDEN.values():
        assert format_graph(make()) == format_graph(make())
