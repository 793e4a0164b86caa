"""Serialization round trip: equal graph, equal text; bad bytes give a clear error."""

from __future__ import annotations

import pytest

from dsgraph.graph import deserialize, format_graph, serialize
from dsgraph.graph.serialize import SerializeError
from tests.golden import graphs as golden


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
