"""Which equations of a step run on a side stream, launched at the start of the step (the Engram
overlap, spec model-v41 4.3): the row gathers from host-resident Engram tables depend only on the step's
tokens (through `engram_hash`) and the tables, not on any earlier layer, so their PCIe reads can run
while the first layers compute.

`plan_side_stream` marks every equation that reads a host table (`placement.is_host_table`) and depends
only on graph inputs that are step inputs or weights (never a cache, which steps write in place), plus
every equation those need (their ancestors, all of the same kind). The plan moves them to the front of
the program, keeping their relative order; the main stream waits on one event per hoisted equation
before the first main-stream equation that reads its outputs. `platform/cuda/execute.py` runs the plan:
the side stream first waits for the main stream (the step's inputs are copied there), hoisted steps
launch on it and record their events, and a join at the end of a run (or of a captured piece) makes the
main stream wait for everything left. Inside `torch.cuda.graph(...)` the same fork, event record/wait
and join are captured as graph dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from dsgraph.graph.ir import Var
from dsgraph.platform.cuda.placement import is_host_table
from dsgraph.platform.registry import Program

__all__ = ["SidePlan", "plan_side_stream", "reorder"]

_PURE_INPUTS = ("step.", "weights.")


@dataclass(frozen=True)
class SidePlan:
    """Over the steps of the program it was made from: `order` the execution order (hoisted steps first),
    `side` the hoisted steps, `waits[i]` the hoisted steps main step i waits on (before running)."""

    order: tuple[int, ...]
    side: frozenset[int]
    waits: dict[int, tuple[int, ...]]

    @property
    def signals(self) -> frozenset[int]:
        """Hoisted steps that record an event (some main step waits on them)."""
        return frozenset(h for hs in self.waits.values() for h in hs)

    def as_text(self, program: Program) -> str:
        """The plan over `program` (the one it was made from), one line per hoisted step and per wait."""
        steps = program.steps
        lines = [f"side stream of {program.graph.name}: {len(self.side)} of {len(steps)} steps hoisted"]
        for i in sorted(self.side):
            lines.append(f"  side [{i}] {steps[i].eqn.op}")
        for i in sorted(self.waits):
            hs = ", ".join(f"[{h}] {steps[h].eqn.op}" for h in self.waits[i])
            lines.append(f"  main [{i}] {steps[i].eqn.op} waits on {hs}")
        return "\n".join(lines) + "\n"


def _hoisted(program: Program, host: Callable[[str], bool]) -> frozenset[int]:
    graph = program.graph
    pure = {v.id for v, n in zip(graph.inputs, graph.input_names, strict=True) if n.startswith(_PURE_INPUTS)}
    tables = {v.id for v, n in zip(graph.inputs, graph.input_names, strict=True) if host(n)} & pure
    producer: dict[int, int] = {}
    seeds: list[int] = []
    for i, step in enumerate(program.steps):
        ins = [a.id for a in step.eqn.inputs if isinstance(a, Var)]
        if step.eqn.op in program.inplace or not all(v in pure for v in ins):
            continue
        for out in step.eqn.outputs:
            pure.add(out.id)
            producer[out.id] = i
        if any(v in tables for v in ins):
            seeds.append(i)
    hoisted: set[int] = set()
    stack = list(seeds)
    while stack:
        i = stack.pop()
        if i in hoisted:
            continue
        hoisted.add(i)
        stack += [
            producer[a.id] for a in program.steps[i].eqn.inputs if isinstance(a, Var) and a.id in producer
        ]
    return frozenset(hoisted)


def plan_side_stream(program: Program, host: Callable[[str], bool] = is_host_table) -> SidePlan:
    """The side-stream plan of `program` (see the module doc); `host` says which graph inputs are
    host-resident tables (by input name)."""
    side = _hoisted(program, host)
    order = tuple(sorted(side)) + tuple(i for i in range(len(program.steps)) if i not in side)
    made = {out.id: i for i in side for out in program.steps[i].eqn.outputs}
    waited: set[int] = set()
    waits: dict[int, tuple[int, ...]] = {}
    for i in order:
        if i in side:
            continue
        hs = sorted(
            {made[a.id] for a in program.steps[i].eqn.inputs if isinstance(a, Var) and a.id in made} - waited
        )
        if hs:
            waits[i] = tuple(hs)
            waited.update(hs)
    return SidePlan(order, side, waits)


def reorder(program: Program, plan: SidePlan) -> tuple[Program, SidePlan]:
    """`program` with its steps in the plan's order, and the plan renumbered onto it."""
    new = {old: k for k, old in enumerate(plan.order)}
    moved = replace(program, steps=tuple(program.steps[i] for i in plan.order))
    waits = {new[i]: tuple(sorted(new[h] for h in hs)) for i, hs in plan.waits.items()}
    return moved, SidePlan(tuple(range(len(plan.order))), frozenset(new[i] for i in plan.side), waits)
