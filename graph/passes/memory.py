"""Memory planning: liveness-based reuse of one arena for every value an equation produces.

Graph inputs (weights, caches, step metadata) live outside the arena. A value is live from the
equation that defines it until the last equation that reads it (graph outputs: until the end).
A value read by equation i is not released before equation i's outputs are placed, so an op never
writes over its own operands. Placement is first fit by offset among the free gaps.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgraph.graph.ir import Graph, Var


@dataclass(frozen=True, slots=True)
class Slot:
    var_id: int
    offset: int
    nbytes: int
    first: int  # index of the defining equation
    last: int  # index of the last reader (len(eqns) for graph outputs)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    slots: tuple[Slot, ...]
    arena_bytes: int  # size of the arena: the largest end offset
    peak_bytes: int  # the most bytes simultaneously live (a lower bound for arena_bytes)
    unplanned_bytes: int  # bytes of all values without reuse, for the report

    def as_text(self) -> str:
        lines = [
            f"arena {self.arena_bytes} B, peak live {self.peak_bytes} B, "
            f"without reuse {self.unplanned_bytes} B"
        ]
        lines += [
            f"  v{s.var_id}: [{s.offset}, {s.offset + s.nbytes}) live {s.first}..{s.last}" for s in self.slots
        ]
        return "\n".join(lines) + "\n"


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _lifetimes(graph: Graph) -> dict[int, int]:
    last: dict[int, int] = {}
    for index, eqn in enumerate(graph.eqns):
        for a in eqn.inputs:
            if isinstance(a, Var):
                last[a.id] = index
    for a in graph.outputs:
        if isinstance(a, Var):
            last[a.id] = len(graph.eqns)
    return last


def _first_fit(live: list[Slot], size: int) -> int:
    offset = 0
    for slot in sorted(live, key=lambda s: s.offset):
        if slot.offset - offset >= size:
            return offset
        offset = max(offset, slot.offset + slot.nbytes)
    return offset


def plan_memory(graph: Graph, *, alignment: int = 256) -> MemoryPlan:
    last = _lifetimes(graph)
    live: list[Slot] = []
    slots: list[Slot] = []
    peak = 0
    for index, eqn in enumerate(graph.eqns):
        live = [s for s in live if s.last >= index]
        for out in eqn.outputs:
            size = _align(max(out.type.nbytes(), 1), alignment)
            slot = Slot(out.id, _first_fit(live, size), size, index, last.get(out.id, index))
            live.append(slot)
            slots.append(slot)
        peak = max(peak, sum(s.nbytes for s in live))
    arena = max((s.offset + s.nbytes for s in slots), default=0)
    return MemoryPlan(tuple(slots), arena, peak, sum(s.nbytes for s in slots))
