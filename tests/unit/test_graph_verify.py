"""The verifier rejects broken graphs with a message that names the equation."""

from __future__ import annotations

import dataclasses

import pytest

import dsgraph.ops  # noqa: F401
from dsgraph.graph import Eqn, TensorType, Var, VerifyError, make_graph, verify
from dsgraph.ops import core as C

F = TensorType(("tokens", 4), "f32")


def _graph():  # type: ignore[no-untyped-def]
    def f(x, y):  # type: ignore[no-untyped-def]
        return C.exp(x + y) * y

    return make_graph(f, F, F)


def test_valid_graph_passes() -> None:
    g = _graph()
    assert verify(g) is g


def test_unbound_value_names_equation() -> None:
    g = _graph()
    ghost = Var(99, F)
    bad = dataclasses.replace(g.eqns[1], inputs=(ghost,))
    g2 = dataclasses.replace(g, eqns=(g.eqns[0], bad, g.eqns[2]))
    with pytest.raises(VerifyError, match=r"eqn 1 `%\d+: f32\[tokens,4\] = exp %99`.*unbound value %99"):
        verify(g2)


def test_double_assignment_names_equation() -> None:
    g = _graph()
    first_out = g.eqns[0].outputs[0]
    bad = dataclasses.replace(g.eqns[1], outputs=(first_out,))
    g2 = dataclasses.replace(g, eqns=(g.eqns[0], bad, g.eqns[2]))
    with pytest.raises(VerifyError, match=rf"eqn 1 .*exp.*%{first_out.id} assigned twice"):
        verify(g2)


def test_wrong_output_type_names_equation_and_rule() -> None:
    g = _graph()
    out = g.eqns[1].outputs[0]
    wrong = Var(out.id, TensorType(("tokens", 5), "f32"))
    g2 = dataclasses.replace(g, eqns=(g.eqns[0], dataclasses.replace(g.eqns[1], outputs=(wrong,)), g.eqns[2]))
    with pytest.raises(VerifyError, match=r"eqn 1 .*test_graph_verify.py:\d+.*(wrong output type|used as)"):
        verify(g2)


def test_wrong_dtype_from_rule_is_reported() -> None:
    g = _graph()
    out = g.eqns[0].outputs[0]
    wrong = Var(out.id, TensorType(("tokens", 4), "bf16"))
    eqns = (dataclasses.replace(g.eqns[0], outputs=(wrong,)),)
    g2 = dataclasses.replace(g, eqns=eqns, outputs=(wrong,), output_names=("out",))
    with pytest.raises(
        VerifyError, match=r"eqn 0 .*add.*wrong output type; the shape rule gives f32\[tokens,4\]"
    ):
        verify(g2)


def test_unknown_op_is_reported() -> None:
    g = _graph()
    bad = Eqn("no_such_op", g.eqns[0].inputs, g.eqns[0].outputs, None)
    with pytest.raises(VerifyError, match="eqn 0 .*unknown op 'no_such_op'"):
        verify(dataclasses.replace(g, eqns=(bad, *g.eqns[1:])))


def test_shape_error_at_trace_time_names_op_and_source() -> None:
    from dsgraph.graph import ShapeError

    def f(x, y):  # type: ignore[no-untyped-def]
        return x + y

    with pytest.raises(ShapeError, match=r"op add: shapes .* do not broadcast .*test_graph_verify.py:\d+"):
        make_graph(f, TensorType(("tokens", 4), "f32"), TensorType(("tokens", 5), "f32"))
    with pytest.raises(ShapeError, match="op add: operands have dtypes"):
        make_graph(f, TensorType((4,), "f32"), TensorType((4,), "bf16"))
