"""Printed graphs equal the golden files. Regenerate with DSGRAPH_REGEN_GOLDEN=1; the diff is the review."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

from dsgraph.graph import format_graph, verify

HERE = pathlib.Path(__file__).parent
DATA = HERE / "data"


def _load_graphs() -> dict:  # type: ignore[type-arg]
    spec = importlib.util.spec_from_file_location("golden_graphs", HERE / "graphs.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.GOLDEN


GOLDEN = _load_graphs()


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
