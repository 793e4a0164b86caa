"""Op declarations: a name, a frozen params dataclass, a shape/dtype rule and a docstring.

Ops are declared once, in `dsgraph.ops`, and registered here by name so the tracer, the verifier,
serialization and every platform's rule table refer to the same declaration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsgraph.graph.types import TensorType

ShapeRule = Callable[[Any, tuple[TensorType, ...]], tuple[TensorType, ...]]


class ShapeError(ValueError):
    """An op was applied to operands its shape/dtype rule rejects."""


class UnknownOpError(KeyError):
    """No op with that name was declared."""

    def __str__(self) -> str:
        return str(self.args[0])


def shape_field(default: Any = dataclasses.MISSING) -> Any:
    """A params field that holds a shape: symbolic dims in it are replaced when specializing."""
    if default is dataclasses.MISSING:
        return field(metadata={"shape": True})
    return field(default=default, metadata={"shape": True})


def params(cls: type) -> type:
    """Decorator for op params: a frozen, slotted dataclass (hashable, comparable, serializable)."""
    return dataclass(frozen=True, slots=True)(cls)


@params
class NoParams:
    """Params of an op that takes none."""


@dataclass(frozen=True, slots=True)
class OpDef:
    """One op of the closed op set. Calling it on tracers appends an equation to the current trace."""

    name: str
    params_type: type
    rule: ShapeRule
    doc: str
    num_inputs: int | None = None
    is_pure: bool = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from dsgraph.graph.trace import bind  # trace imports op; bind lives there

        return bind(self, args, self.make_params(kwargs))

    def make_params(self, kwargs: dict[str, Any]) -> Any:
        try:
            return self.params_type(**kwargs)
        except TypeError as exc:
            names = [f.name for f in dataclasses.fields(self.params_type)]
            raise ShapeError(f"op {self.name}: bad params {sorted(kwargs)}; takes {names} ({exc})") from None

    def infer(self, p: Any, in_types: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
        """Output types for these params and operand types; ShapeError names the op."""
        if self.num_inputs is not None and len(in_types) != self.num_inputs:
            raise ShapeError(f"op {self.name}: takes {self.num_inputs} operands, got {len(in_types)}")
        try:
            return tuple(self.rule(p, in_types))
        except ShapeError as exc:
            raise ShapeError(f"op {self.name}: {exc}") from None


_OPS: dict[str, OpDef] = {}


def declare_op(
    name: str,
    params_type: type,
    rule: ShapeRule,
    doc: str,
    *,
    num_inputs: int | None = None,
    is_pure: bool = True,
) -> OpDef:
    """Declare and register an op; a second declaration of the same name is an error."""
    if name in _OPS:
        raise ValueError(f"op {name!r} declared twice")
    if not dataclasses.is_dataclass(params_type):
        raise TypeError(f"op {name!r}: params type {params_type!r} is not a dataclass")
    op = OpDef(name, params_type, rule, doc, num_inputs, is_pure)
    _OPS[name] = op
    return op


def get_op(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise UnknownOpError(
            f"unknown op {name!r}; declared ops: {sorted(_OPS)} (is dsgraph.ops imported?)"
        ) from None


def all_ops() -> tuple[OpDef, ...]:
    return tuple(_OPS[name] for name in sorted(_OPS))
