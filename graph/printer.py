"""Stable text form of a graph: one equation per line, types on every value, source as a comment.

Values are renumbered in definition order, so the text does not depend on how ids were allocated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var


def format_params(p: Any) -> str:
    if p is None or not dataclasses.is_dataclass(p):
        return ""
    items = [f"{f.name}={_fmt_value(getattr(p, f.name))}" for f in dataclasses.fields(p)]
    return f"[{', '.join(items)}]" if items else ""


def _fmt_value(value: Any) -> str:
    if isinstance(value, tuple):
        inner = ",".join(_fmt_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, float):
        return repr(value)
    return str(value)


class _Names:
    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def define(self, var: Var) -> str:
        self.ids[var.id] = len(self.ids)
        return self.ref(var)

    def ref(self, atom: Atom) -> str:
        if isinstance(atom, Lit):
            return f"{atom.value!r}:{atom.type.dtype}"
        return f"%{self.ids.get(atom.id, f'?{atom.id}')}"


def format_eqn(eqn: Eqn, names: _Names | None = None, *, with_source: bool = True) -> str:
    """One equation as text; with `names=None` raw ids are used (for error messages)."""
    names = names or _RawNames()
    args = ", ".join(names.ref(a) for a in eqn.inputs)
    outs = ", ".join(f"{names.define(o)}: {o.type}" for o in eqn.outputs)
    text = f"{outs} = {eqn.op}{format_params(eqn.params)} {args}".rstrip()
    if with_source and eqn.source:
        text = f"{text:<72} # {eqn.source}"
    return text


class _RawNames(_Names):
    def define(self, var: Var) -> str:
        return f"%{var.id}"

    def ref(self, atom: Atom) -> str:
        return f"{atom.value!r}:{atom.type.dtype}" if isinstance(atom, Lit) else f"%{atom.id}"


def format_graph(graph: Graph, *, with_source: bool = True) -> str:
    names = _Names()
    params = ", ".join(
        f"{names.define(v)}: {v.type} {n}" for v, n in zip(graph.inputs, graph.input_names, strict=True)
    )
    lines = [f"graph {graph.name}({params}) {{"]
    lines += ["  " + format_eqn(e, names, with_source=with_source) for e in graph.eqns]
    outs = ", ".join(f"{names.ref(a)} {n}" for a, n in zip(graph.outputs, graph.output_names, strict=True))
    lines += [f"  return {outs}", "}"]
    return "\n".join(line.rstrip() for line in lines) + "\n"
