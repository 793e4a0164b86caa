"""The IR: a flat, immutable, typed list of equations in single-assignment form (jaxpr-shaped)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsgraph.graph.types import TensorType


@dataclass(frozen=True, slots=True)
class Var:
    """A value defined once, by a graph input or an equation output. `id` is unique in its graph."""

    id: int
    type: TensorType


@dataclass(frozen=True, slots=True)
class Lit:
    """A scalar constant operand (shape ())."""

    value: int | float | bool
    type: TensorType


Atom = Var | Lit


@dataclass(frozen=True, slots=True)
class Eqn:
    """`outputs = op[params](inputs)`; `source` is the user's "file.py:line" that created it."""

    op: str
    inputs: tuple[Atom, ...]
    outputs: tuple[Var, ...]
    params: Any
    source: str = ""


@dataclass(frozen=True, slots=True)
class Graph:
    """A program: named inputs (weights, caches and step metadata are all inputs), equations, outputs."""

    inputs: tuple[Var, ...]
    eqns: tuple[Eqn, ...]
    outputs: tuple[Atom, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    name: str = "graph"

    def __post_init__(self) -> None:
        if len(self.input_names) != len(self.inputs):
            raise ValueError(
                f"graph {self.name}: {len(self.inputs)} inputs but {len(self.input_names)} names"
            )
        if len(self.output_names) != len(self.outputs):
            raise ValueError(
                f"graph {self.name}: {len(self.outputs)} outputs but {len(self.output_names)} names"
            )

    def input_type(self, name: str) -> TensorType:
        return self.inputs[self.input_names.index(name)].type

    @property
    def symbols(self) -> frozenset[str]:
        """Symbolic dim names used anywhere in the graph."""
        found: set[str] = set()
        for var in self.inputs:
            found |= var.type.symbols
        for eqn in self.eqns:
            for out in eqn.outputs:
                found |= out.type.symbols
        return frozenset(found)

    def max_var_id(self) -> int:
        ids = [v.id for v in self.inputs] + [o.id for e in self.eqns for o in e.outputs]
        return max(ids, default=-1)
