"""Dead-code elimination: drop pure equations none of whose outputs is used."""

from __future__ import annotations

import dataclasses

from dsgraph.graph.ir import Graph, Var
from dsgraph.graph.op import get_op


def dce(graph: Graph) -> Graph:
    live = {a.id for a in graph.outputs if isinstance(a, Var)}
    kept = []
    for eqn in reversed(graph.eqns):
        used = any(o.id in live for o in eqn.outputs)
        if used or not get_op(eqn.op).is_pure:
            kept.append(eqn)
            live.update(a.id for a in eqn.inputs if isinstance(a, Var))
    return dataclasses.replace(graph, eqns=tuple(reversed(kept)))
