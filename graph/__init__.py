"""The IR: types, equations, graphs, tracing, verification, printing, passes and serialization."""

from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var
from dsgraph.graph.op import NoParams, OpDef, ShapeError, declare_op, get_op, params, shape_field
from dsgraph.graph.printer import format_graph
from dsgraph.graph.serialize import deserialize, serialize
from dsgraph.graph.trace import Tracer, make_graph
from dsgraph.graph.types import Dim, TensorType, parse_type
from dsgraph.graph.verify import VerifyError, verify

__all__ = [
    "Atom",
    "Dim",
    "Eqn",
    "Graph",
    "Lit",
    "NoParams",
    "OpDef",
    "ShapeError",
    "TensorType",
    "Tracer",
    "Var",
    "VerifyError",
    "declare_op",
    "deserialize",
    "format_graph",
    "get_op",
    "make_graph",
    "params",
    "parse_type",
    "serialize",
    "shape_field",
    "verify",
]
