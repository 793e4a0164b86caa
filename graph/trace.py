"""JAX-style tracing: run a Python function on tracers and record one equation per op call."""

from __future__ import annotations

import contextvars
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsgraph.graph import pytree
from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var
from dsgraph.graph.op import OpDef, ShapeError, get_op
from dsgraph.graph.types import FLOAT_DTYPES, INT_DTYPES, TensorType

_GRAPH_DIR = os.path.dirname(os.path.abspath(__file__))
_OPS_DIR = os.path.join(os.path.dirname(_GRAPH_DIR), "ops")


@dataclass
class _TraceState:
    """The equations recorded so far by one `make_graph` call."""

    eqns: list[Eqn] = field(default_factory=list)
    next_id: int = 0

    def new_var(self, ttype: TensorType) -> Var:
        var = Var(self.next_id, ttype)
        self.next_id += 1
        return var


_CURRENT: contextvars.ContextVar[_TraceState | None] = contextvars.ContextVar("dsgraph_trace", default=None)


class Tracer:
    """Stands for a value of the graph being traced; arithmetic on it appends equations."""

    __slots__ = ("var", "_state")

    def __init__(self, var: Var, state: _TraceState) -> None:
        self.var = var
        self._state = state

    @property
    def type(self) -> TensorType:
        return self.var.type

    @property
    def shape(self) -> tuple[int | str, ...]:
        return self.var.type.shape

    @property
    def dtype(self) -> str:
        return self.var.type.dtype

    @property
    def ndim(self) -> int:
        return self.var.type.rank

    def __repr__(self) -> str:
        return f"Tracer(%{self.var.id}: {self.var.type})"

    def __bool__(self) -> bool:
        raise TypeError(
            "a traced value has no Python truth value (data-dependent control flow is not traceable)"
        )

    def __add__(self, other: Any) -> Tracer:
        return get_op("add")(self, other)

    def __radd__(self, other: Any) -> Tracer:
        return get_op("add")(other, self)

    def __sub__(self, other: Any) -> Tracer:
        return get_op("sub")(self, other)

    def __rsub__(self, other: Any) -> Tracer:
        return get_op("sub")(other, self)

    def __mul__(self, other: Any) -> Tracer:
        return get_op("mul")(self, other)

    def __rmul__(self, other: Any) -> Tracer:
        return get_op("mul")(other, self)

    def __truediv__(self, other: Any) -> Tracer:
        return get_op("div")(self, other)

    def __rtruediv__(self, other: Any) -> Tracer:
        return get_op("div")(other, self)

    def __matmul__(self, other: Any) -> Tracer:
        return get_op("matmul")(self, other)

    def __floordiv__(self, other: Any) -> Tracer:
        return get_op("floor_div")(self, other)

    def __neg__(self) -> Tracer:
        return get_op("neg")(self)


def _user_source() -> str:
    """ "dir/file.py:line" of the innermost frame outside dsgraph.graph and dsgraph.ops."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not (path.startswith(_GRAPH_DIR) or path.startswith(_OPS_DIR)):
            parent = os.path.basename(os.path.dirname(path))
            return f"{parent}/{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _literal_dtype(value: bool | int | float, tracers: list[Tracer]) -> str:
    """A scalar takes the dtype of the first operand of its kind (float, int, bool), like JAX's weak types."""
    kinds = {bool: ("bool",), int: tuple(INT_DTYPES), float: tuple(FLOAT_DTYPES)}[type(value)]
    same_kind = [t.dtype for t in tracers if t.dtype in kinds]
    if same_kind:
        return same_kind[0]
    return {bool: "bool", int: "i32", float: "f32"}[type(value)]


def _to_atom(value: Any, state: _TraceState, tracers: list[Tracer]) -> Atom:
    if isinstance(value, Tracer):
        if value._state is not state:
            raise ShapeError(f"value {value!r} belongs to another trace")
        return value.var
    if isinstance(value, (bool, int, float)):
        return Lit(value, TensorType((), _literal_dtype(value, tracers)))
    raise ShapeError(
        f"operand {value!r} of type {type(value).__name__} is neither a traced value nor a scalar"
    )


def bind(op: OpDef, args: tuple[Any, ...], p: Any) -> Any:
    """Append `op[p](args)` to the current trace; returns one tracer or a tuple of them."""
    state = _CURRENT.get()
    if state is None:
        raise RuntimeError(f"op {op.name} called outside make_graph (ops only build graphs)")
    tracers = [a for a in args if isinstance(a, Tracer)]
    atoms = tuple(_to_atom(a, state, tracers) for a in args)
    source = _user_source()
    try:
        out_types = op.infer(p, tuple(a.type for a in atoms))
    except ShapeError as exc:
        raise ShapeError(f"{exc} (at {source})") from None
    outs = tuple(state.new_var(t) for t in out_types)
    state.eqns.append(Eqn(op.name, atoms, outs, p, source))
    tracers = tuple(Tracer(v, state) for v in outs)
    return tracers[0] if len(tracers) == 1 else tracers


def _is_type_leaf(x: Any) -> bool:
    return isinstance(x, TensorType)


def _is_out_leaf(x: Any) -> bool:
    return isinstance(x, (Tracer, bool, int, float))


def _param_names(fn: Callable[..., Any], count: int) -> list[str]:
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
        names = []
    return names[:count] if len(names) >= count else [f"arg{i}" for i in range(count)]


def make_graph(fn: Callable[..., Any], *input_types: Any, name: str | None = None) -> Graph:
    """Trace `fn` on tracers of `input_types` (TensorTypes, or nested dicts/lists of them).

    Inputs are named by `fn`'s parameter names plus the dotted path inside each argument
    ("weights.layers.0.wq_a"); outputs by the path inside the returned tree.
    """
    state = _TraceState()
    token = _CURRENT.set(state)
    try:
        tree = dict(zip(_param_names(fn, len(input_types)), input_types, strict=True))
        in_leaves = pytree.flatten(tree, _is_type_leaf)
        tracers = {path: Tracer(state.new_var(t), state) for path, t in in_leaves}
        args = pytree.unflatten_like(tree, _is_type_leaf, tracers)
        result = fn(*args.values())
        out_leaves = pytree.flatten(result, _is_out_leaf)
        outputs = tuple(_to_atom(v, state, []) for _, v in out_leaves)
    finally:
        _CURRENT.reset(token)
    return Graph(
        inputs=tuple(t.var for t in tracers.values()),
        eqns=tuple(state.eqns),
        outputs=outputs,
        input_names=tuple(tracers),
        output_names=tuple(path for path, _ in out_leaves),
        name=name or getattr(fn, "__name__", "graph"),
    )
