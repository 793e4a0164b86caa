"""Graphs to bytes and back (versioned JSON), for bundles and golden files.

Params are rebuilt from the op declarations by field name, so the declared ops must be imported
(`import dsgraph.ops`) before deserializing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var
from dsgraph.graph.op import get_op
from dsgraph.graph.types import TensorType, parse_type

FORMAT = "dsgraph.graph"
VERSION = 1


class SerializeError(ValueError):
    """The bytes are not a graph of a format version this code reads."""


def _atom_to_json(atom: Atom) -> Any:
    if isinstance(atom, Lit):
        return {"lit": atom.value, "type": str(atom.type)}
    return atom.id


def _params_to_json(p: Any) -> dict[str, Any]:
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}


def graph_to_json(graph: Graph) -> dict[str, Any]:
    var_types: dict[int, str] = {v.id: str(v.type) for v in graph.inputs}
    eqns = []
    for e in graph.eqns:
        var_types.update({o.id: str(o.type) for o in e.outputs})
        eqns.append(
            {
                "op": e.op,
                "in": [_atom_to_json(a) for a in e.inputs],
                "out": [o.id for o in e.outputs],
                "params": _params_to_json(e.params),
                "src": e.source,
            }
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": graph.name,
        "types": {str(k): v for k, v in var_types.items()},
        "inputs": [[v.id, n] for v, n in zip(graph.inputs, graph.input_names, strict=True)],
        "eqns": eqns,
        "outputs": [[_atom_to_json(a), n] for a, n in zip(graph.outputs, graph.output_names, strict=True)],
    }


def serialize(graph: Graph) -> bytes:
    return json.dumps(graph_to_json(graph), separators=(",", ":")).encode()


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def _atom_from_json(item: Any, vars_: dict[int, Var]) -> Atom:
    if isinstance(item, dict):
        return Lit(item["lit"], parse_type(item["type"]))
    return vars_[item]


def graph_from_json(data: dict[str, Any]) -> Graph:
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise SerializeError(
            f"not a {FORMAT} v{VERSION} graph: format={data.get('format')} version={data.get('version')}"
        )
    types: dict[int, TensorType] = {int(k): parse_type(v) for k, v in data["types"].items()}
    vars_ = {i: Var(i, t) for i, t in types.items()}
    eqns = []
    for e in data["eqns"]:
        op = get_op(e["op"])
        p = op.params_type(**{k: _tuplify(v) for k, v in e["params"].items()})
        ins = tuple(_atom_from_json(a, vars_) for a in e["in"])
        eqns.append(Eqn(e["op"], ins, tuple(vars_[i] for i in e["out"]), p, e["src"]))
    return Graph(
        inputs=tuple(vars_[i] for i, _ in data["inputs"]),
        eqns=tuple(eqns),
        outputs=tuple(_atom_from_json(a, vars_) for a, _ in data["outputs"]),
        input_names=tuple(n for _, n in data["inputs"]),
        output_names=tuple(n for _, n in data["outputs"]),
        name=data["name"],
    )


def deserialize(blob: bytes) -> Graph:
    try:
        data = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SerializeError(f"graph bytes are not JSON: {exc}") from None
    return graph_from_json(data)
