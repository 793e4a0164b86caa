"""Random graphs for property tests: a random straight-line program over a few shapes."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import dsgraph.ops  # noqa: F401
from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.ops import core as C
from dsgraph.ops import shape as S

UNARY = (C.exp, C.neg, C.sigmoid, C.silu, C.relu)
BINARY = (C.add, C.sub, C.mul, C.maximum)


def _step(values: list[Any], choice: tuple[int, int, int, int]) -> Any:
    kind, i, j, width = choice
    a = values[i % len(values)]
    same = [v for v in values if v.shape == a.shape]
    b = same[j % len(same)]
    if kind == 0:
        return UNARY[j % len(UNARY)](a)
    if kind == 1:
        return BINARY[j % len(BINARY)](a, b)
    if kind == 2:
        return S.concat(a, b, axis=1)
    if kind == 3:
        return C.reduce_sum(a, axes=(1,), keepdims=True)
    return S.slice_(a, axis=1, start=0, stop=min(width, a.shape[1]))


def build(
    tokens: int, widths: list[int], program: list[tuple[int, int, int, int]], outputs: list[int]
) -> Graph:
    def fn(*xs):  # type: ignore[no-untyped-def]
        values = list(xs)
        for choice in program:
            values.append(_step(values, choice))
        picked = {f"o{k}": values[k % len(values)] for k in outputs}
        return picked

    types = [TensorType((tokens, w), "f32") for w in widths]
    return make_graph(fn, *types)


@st.composite
def random_graphs(draw: st.DrawFn) -> Graph:
    tokens = draw(st.integers(1, 6))
    widths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))
    steps = st.tuples(st.integers(0, 4), st.integers(0, 50), st.integers(0, 50), st.integers(1, 9))
    program = draw(st.lists(steps, min_size=1, max_size=25))
    outputs = draw(st.lists(st.integers(0, 60), min_size=1, max_size=4))
    return build(tokens, widths, program, outputs)
