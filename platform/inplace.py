"""Ordering a graph for a platform whose rules overwrite some operands in place (`Platform.inplace`).

The traced graph is functional: `ring' = swa_write(ring, ...)` may come before `attention(..., ring, ...)`,
which reads the old ring (positions of earlier steps that a long chunk's writes would overwrite). Any
topological order computes the same values, so lowering moves each in-place equation after every other
reader of the value it overwrites (a stable order: otherwise the traced order). If a reader needs the
in-place equation's own result, no order exists and lowering fails naming both equations. The result is
checked: no overwritten value has a later reader, is read by an op that may return a view of it, appears
twice among its writer's operands, is a literal or is a graph output.
"""

from __future__ import annotations

import heapq

from dsgraph.graph.ir import Eqn, Graph, Var
from dsgraph.graph.printer import format_eqn
from dsgraph.platform.registry import LoweringError, Platform

# ops whose rules may return a view of (or the same tensor as) their operand: an in-place write to that
# operand would change the view too, so an overwritten value must not be read by one of them
VIEW_OPS = frozenset({"reshape", "broadcast_to", "slice", "cast"})


def _pairs(plat: Platform, eqn: Eqn) -> tuple[tuple[int, int], ...]:
    return plat.inplace[eqn.op](eqn) if eqn.op in plat.inplace else ()


def _show(graph: Graph, i: int) -> str:
    return f"eqn {i} `{format_eqn(graph.eqns[i], with_source=False)}`"


def order_for_inplace(graph: Graph, plat: Platform) -> Graph:
    """`graph` with its equations reordered so that in-place writes follow the readers of the old value."""
    eqns = graph.eqns
    if not any(_pairs(plat, e) for e in eqns):
        return graph
    producer = {o.id: i for i, e in enumerate(eqns) for o in e.outputs}
    readers: dict[int, list[int]] = {}
    for i, e in enumerate(eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                readers.setdefault(a.id, []).append(i)
    after: list[set[int]] = [
        {producer[a.id] for a in e.inputs if isinstance(a, Var) and a.id in producer} for e in eqns
    ]
    for i, e in enumerate(eqns):
        for operand, _ in _pairs(plat, e):
            atom = e.inputs[operand]
            if isinstance(atom, Var):
                after[i] |= {k for k in readers[atom.id] if k != i}
    order = _stable_topological(after)
    if len(order) < len(eqns):
        stuck = sorted(set(range(len(eqns))) - set(order))
        writer = next(i for i in stuck if _pairs(plat, eqns[i]))
        blocked = [k for k in sorted(after[writer]) if k in stuck]
        raise LoweringError(
            f"graph {graph.name}: {_show(graph, writer)} overwrites an operand in place on platform "
            f"'{plat.name}', but {_show(graph, blocked[0])} reads the old value and depends on the write"
        )
    ordered = Graph(
        graph.inputs,
        tuple(eqns[i] for i in order),
        graph.outputs,
        graph.input_names,
        graph.output_names,
        graph.name,
    )
    check_inplace(ordered, plat)
    return ordered


def _stable_topological(after: list[set[int]]) -> list[int]:
    """Indices in an order where each follows everything in its `after` set; among the ready ones the
    lowest index first. Indices on a cycle are left out."""
    waiting = [len(deps) for deps in after]
    followers: list[list[int]] = [[] for _ in after]
    for i, deps in enumerate(after):
        for d in deps:
            followers[d].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for f in followers[i]:
            waiting[f] -= 1
            if waiting[f] == 0:
                heapq.heappush(ready, f)
    return order


def check_inplace(graph: Graph, plat: Platform) -> None:
    """Every operand an in-place rule overwrites is a value with no later use (module doc)."""
    last_use: dict[int, int] = {}
    for i, eqn in enumerate(graph.eqns):
        for a in eqn.inputs:
            if isinstance(a, Var):
                last_use[a.id] = i
    outputs = {a.id: n for a, n in zip(graph.outputs, graph.output_names, strict=True) if isinstance(a, Var)}
    views = {
        a.id: j for j, e in enumerate(graph.eqns) if e.op in VIEW_OPS for a in e.inputs if isinstance(a, Var)
    }
    for i, eqn in enumerate(graph.eqns):
        for operand, _ in _pairs(plat, eqn):
            atom = eqn.inputs[operand]
            where = f"graph {graph.name}, {_show(graph, i)}: operand {operand}"
            if isinstance(atom, Var) and atom.id in views:
                raise LoweringError(
                    f"{where} (%{atom.id}) is overwritten in place on platform '{plat.name}' but "
                    f"{_show(graph, views[atom.id])} may hold a view of it"
                )
            if not isinstance(atom, Var):
                raise LoweringError(f"{where} is written in place on platform '{plat.name}' but is a literal")
            later = last_use[atom.id]
            if later > i:
                raise LoweringError(
                    f"{where} (%{atom.id}) is overwritten in place on platform '{plat.name}' but "
                    f"{_show(graph, later)} reads its old value afterwards"
                )
            if sum(a == atom for a in eqn.inputs) > 1:
                raise LoweringError(
                    f"{where} (%{atom.id}) is overwritten in place but is also another operand"
                )
            if atom.id in outputs:
                raise LoweringError(
                    f"{where} (%{atom.id}) is overwritten in place on platform '{plat.name}' but is also "
                    f"graph output '{outputs[atom.id]}'"
                )
