"""Specialization: replace symbolic dims by the concrete sizes of one bucket."""

from __future__ import annotations

import dataclasses
from typing import Any

from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var
from dsgraph.graph.op import ShapeError, get_op
from dsgraph.graph.types import Dim, TensorType


def _dims(shape: tuple[Dim, ...], sizes: dict[str, int]) -> tuple[Dim, ...]:
    return tuple(sizes.get(d, d) if isinstance(d, str) else d for d in shape)


def _params(p: Any, sizes: dict[str, int]) -> Any:
    if not dataclasses.is_dataclass(p):
        return p
    changes = {
        f.name: _dims(getattr(p, f.name), sizes)
        for f in dataclasses.fields(p)
        if f.metadata.get("shape") and isinstance(getattr(p, f.name), tuple)
    }
    return dataclasses.replace(p, **changes) if changes else p


def specialize(graph: Graph, sizes: dict[str, int], *, name: str | None = None) -> Graph:
    """Substitute `sizes` (e.g. {"tokens": 16}) everywhere and re-derive every type by its rule."""
    for dim, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"specialize: size of {dim!r} must be an int >= 0, got {size!r}")
    vars_: dict[int, Var] = {
        v.id: Var(v.id, TensorType(_dims(v.type.shape, sizes), v.type.dtype)) for v in graph.inputs
    }

    def atom(a: Atom) -> Atom:
        return a if isinstance(a, Lit) else vars_[a.id]

    eqns = []
    for eqn in graph.eqns:
        p = _params(eqn.params, sizes)
        ins = tuple(atom(a) for a in eqn.inputs)
        try:
            types = get_op(eqn.op).infer(p, tuple(a.type for a in ins))
        except ShapeError as exc:
            raise ShapeError(f"specialize {sizes} at {eqn.source or eqn.op}: {exc}") from None
        outs = tuple(Var(o.id, t) for o, t in zip(eqn.outputs, types, strict=True))
        vars_.update({o.id: o for o in outs})
        eqns.append(Eqn(eqn.op, ins, outs, p, eqn.source))
    suffix = ",".join(f"{k}={v}" for k, v in sorted(sizes.items()))
    return Graph(
        inputs=tuple(vars_[v.id] for v in graph.inputs),
        eqns=tuple(eqns),
        outputs=tuple(atom(a) for a in graph.outputs),
        input_names=graph.input_names,
        output_names=graph.output_names,
        name=name or f"{graph.name}[{suffix}]",
    )
