"""Common-subexpression elimination: a pure equation equal to an earlier one reuses its outputs."""

from __future__ import annotations

import dataclasses
from typing import Any

from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var
from dsgraph.graph.op import get_op


def _key_atom(atom: Atom, alias: dict[int, Var]) -> Any:
    if isinstance(atom, Lit):
        return ("lit", type(atom.value).__name__, atom.value, atom.type)
    return alias.get(atom.id, atom).id


def _rename(atom: Atom, alias: dict[int, Var]) -> Atom:
    return alias.get(atom.id, atom) if isinstance(atom, Var) else atom


def cse(graph: Graph) -> Graph:
    alias: dict[int, Var] = {}
    seen: dict[Any, Eqn] = {}
    eqns: list[Eqn] = []
    for eqn in graph.eqns:
        eqn = dataclasses.replace(eqn, inputs=tuple(_rename(a, alias) for a in eqn.inputs))
        if get_op(eqn.op).is_pure:
            key = (eqn.op, tuple(_key_atom(a, alias) for a in eqn.inputs), eqn.params)
            first = seen.get(key)
            if first is not None:
                alias.update({o.id: f for o, f in zip(eqn.outputs, first.outputs, strict=True)})
                continue
            seen[key] = eqn
        eqns.append(eqn)
    outputs = tuple(_rename(a, alias) for a in graph.outputs)
    return dataclasses.replace(graph, eqns=tuple(eqns), outputs=outputs)
