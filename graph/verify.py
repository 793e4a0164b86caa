"""The verifier: single assignment, no unbound value, every output type equals the op's shape rule."""

from __future__ import annotations

from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var
from dsgraph.graph.op import ShapeError, UnknownOpError, get_op
from dsgraph.graph.printer import format_eqn


class VerifyError(ValueError):
    """The graph breaks an IR invariant; the message names the equation and its source line."""


def _where(graph: Graph, index: int, eqn: Eqn) -> str:
    src = f" at {eqn.source}" if eqn.source else ""
    return f"graph {graph.name}, eqn {index} `{format_eqn(eqn, with_source=False)}`{src}"


def _check_use(graph: Graph, index: int, eqn: Eqn, atom: Atom, defined: dict[int, Var]) -> None:
    if isinstance(atom, Lit):
        if atom.type.shape != ():
            raise VerifyError(f"{_where(graph, index, eqn)}: literal {atom.value!r} must have shape ()")
        return
    if atom.id not in defined:
        raise VerifyError(f"{_where(graph, index, eqn)}: unbound value %{atom.id}")
    if defined[atom.id].type != atom.type:
        raise VerifyError(
            f"{_where(graph, index, eqn)}: %{atom.id} used as {atom.type} "
            f"but defined as {defined[atom.id].type}"
        )


def _check_eqn(graph: Graph, index: int, eqn: Eqn, defined: dict[int, Var]) -> None:
    for atom in eqn.inputs:
        _check_use(graph, index, eqn, atom, defined)
    try:
        expected = get_op(eqn.op).infer(eqn.params, tuple(a.type for a in eqn.inputs))
    except (ShapeError, UnknownOpError) as exc:
        raise VerifyError(f"{_where(graph, index, eqn)}: {exc}") from None
    found = tuple(o.type for o in eqn.outputs)
    if found != expected:
        shown = ", ".join(map(str, expected))
        raise VerifyError(f"{_where(graph, index, eqn)}: wrong output type; the shape rule gives {shown}")
    for out in eqn.outputs:
        if out.id in defined:
            raise VerifyError(f"{_where(graph, index, eqn)}: %{out.id} assigned twice")
        defined[out.id] = out


def verify(graph: Graph) -> Graph:
    """Raise VerifyError at the first broken invariant; return the graph unchanged otherwise."""
    defined: dict[int, Var] = {}
    for var, name in zip(graph.inputs, graph.input_names, strict=True):
        if var.id in defined:
            raise VerifyError(f"graph {graph.name}: input {name} (%{var.id}) assigned twice")
        defined[var.id] = var
    for index, eqn in enumerate(graph.eqns):
        _check_eqn(graph, index, eqn, defined)
    for atom, name in zip(graph.outputs, graph.output_names, strict=True):
        if isinstance(atom, Var) and atom.id not in defined:
            raise VerifyError(f"graph {graph.name}: output {name} is the unbound value %{atom.id}")
    return graph
