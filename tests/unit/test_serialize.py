"""Serialization round trip: equal graph, equal text; bad bytes give a clear error."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from dsgraph.graph import deserialize, format_graph, serialize
from dsgraph.graph.serialize import SerializeError

spec = importlib.util.spec_from_file_location(
    "golden_graphs", pathlib.Path(__file__).parents[1] / "golden" / "graphs.py"
)
golden = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
spec.loader.exec_module(golden)  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(golden.GOLDEN))
def test_round_trip(name: str) -> None:
    g = golden.GOLDEN[name]()
    blob = serialize(g)
    back = deserialize(blob)
    assert back == g
    assert format_graph(back) == format_graph(g)
    assert serialize(back) == blob


def test_bad_bytes() -> None:
    with pytest.raises(SerializeError, match="not JSON"):
        deserialize(b"\xff\x00")
    with pytest.raises(SerializeError, match="format=None version=None"):
        deserialize(b"{}")
