"""DCE, CSE, specialization and memory planning: invariants and equal results on cpu."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from dsgraph.graph import TensorType, Var, make_graph, verify
from dsgraph.graph.op import ShapeError
from dsgraph.graph.passes import cse, dce, plan_memory, specialize
from dsgraph.ops import core as C
from dsgraph.ops import shape as S
from dsgraph.platform.cpu.interpret import run_graph
from tests.unit import random_graphs as rg


def _inputs(g):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*v.type.shape, generator=gen) for v in g.inputs]


@settings(max_examples=60, deadline=None)
@given(rg.random_graphs())
def test_dce_and_cse_keep_outputs_and_values(g) -> None:  # type: ignore[no-untyped-def]
    verify(g)
    opt = verify(dce(cse(g)))
    assert opt.output_names == g.output_names
    defined = {v.id for v in opt.inputs} | {o.id for e in opt.eqns for o in e.outputs}
    assert all(a.id in defined for a in opt.outputs if isinstance(a, Var))
    assert len(opt.eqns) <= len(g.eqns)
    args = _inputs(g)
    want, got = run_graph(g, args), run_graph(opt, args)
    for name in want:
        assert torch.equal(want[name], got[name]), name


@settings(max_examples=80, deadline=None)
@given(rg.random_graphs())
def test_memory_plan_never_overlaps_live_values(g) -> None:  # type: ignore[no-untyped-def]
    plan = plan_memory(g)
    slots = plan.slots
    for i, a in enumerate(slots):
        assert a.offset % 256 == 0 and a.offset + a.nbytes <= plan.arena_bytes
        for b in slots[i + 1 :]:
            live_together = a.first <= b.last and b.first <= a.last
            disjoint = a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
            assert not live_together or disjoint, (a, b)
    assert plan.peak_bytes <= plan.arena_bytes <= plan.unplanned_bytes


def test_memory_plan_reuses_dead_buffers() -> None:
    def chain(x):  # type: ignore[no-untyped-def]
        for _ in range(10):
            x = C.exp(x)
        return x

    plan = plan_memory(make_graph(chain, TensorType((64, 64), "f32")))
    assert plan.unplanned_bytes == 10 * 64 * 64 * 4
    assert plan.arena_bytes == 2 * 64 * 64 * 4  # ping-pong between two buffers


def test_memory_plan_needs_concrete_dims() -> None:
    g = make_graph(lambda x: C.exp(x), TensorType(("tokens", 4), "f32"))
    with pytest.raises(TypeError, match="symbolic dims"):
        plan_memory(g)


def test_dce_drops_unused_and_cse_merges_equal() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        C.exp(x)  # unused
        return C.sigmoid(x) + C.sigmoid(x)

    g = make_graph(f, TensorType((3,), "f32"))
    assert [e.op for e in dce(g).eqns] == ["sigmoid", "sigmoid", "add"]
    assert [e.op for e in dce(cse(g)).eqns] == ["sigmoid", "add"]


def test_specialize_substitutes_types_and_shape_params() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return S.reshape(x, shape=("tokens", 2, 4))

    g = specialize(make_graph(f, TensorType(("tokens", 8), "f32")), {"tokens": 3})
    verify(g)
    assert g.eqns[0].params.shape == (3, 2, 4)
    assert g.outputs[0].type == TensorType((3, 2, 4), "f32")
    assert not g.symbols
    with pytest.raises(ValueError, match="size of 'tokens' must be an int >= 0"):
        specialize(g, {"tokens": -1})


def test_specialize_rejects_sizes_the_rules_reject() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return S.slice_(x, axis=0, start=0, stop=4)

    g = make_graph(f, TensorType(("tokens",), "f32"))
    verify(specialize(g, {"tokens": 4}))
    with pytest.raises(
        ShapeError, match=r"specialize \{'tokens': 2\} at unit/test_passes.py:\d+: op slice: .*out of range"
    ):
        specialize(g, {"tokens": 2})
