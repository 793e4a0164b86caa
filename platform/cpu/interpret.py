"""The cpu interpreter: run a lowered graph equation by equation (the reference semantics).

Inputs are checked against the graph's types (symbolic dims must bind consistently), and every
rule's result against its equation's type, so a wrong rule fails at the equation that produced it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dsgraph.graph.ir import Atom, Eqn, Graph, Lit, Var
from dsgraph.graph.passes.specialize import specialize
from dsgraph.graph.printer import format_eqn
from dsgraph.graph.types import TensorType
from dsgraph.platform.cpu.dtypes import IR_DTYPES, to_torch
from dsgraph.platform.registry import Program, lower


class ExecutionError(RuntimeError):
    """A value did not match its declared type, or a rule failed; names the equation."""


def bind(ttype: TensorType, value: torch.Tensor, sizes: dict[str, int], what: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise ExecutionError(f"{what}: expected a tensor {ttype}, got {type(value).__name__}")
    found = IR_DTYPES.get(value.dtype, str(value.dtype))
    if found != ttype.dtype or value.dim() != ttype.rank:
        raise ExecutionError(f"{what}: expected {ttype}, got {found}{list(value.shape)}")
    for axis, (dim, size) in enumerate(zip(ttype.shape, value.shape, strict=True)):
        expected = sizes.setdefault(dim, size) if isinstance(dim, str) else dim
        if expected != size:
            name = f"{dim} (axis {axis})" if isinstance(dim, str) else f"axis {axis}"
            raise ExecutionError(
                f"{what}: {name} is {size}, expected {expected} ({ttype}, got {list(value.shape)})"
            )


def literal(atom: Lit, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(atom.value, dtype=to_torch(atom.type.dtype), device=device)


def _value(atom: Atom, env: dict[int, torch.Tensor], device: torch.device) -> torch.Tensor:
    return literal(atom, device) if isinstance(atom, Lit) else env[atom.id]


def where(i: int, eqn: Eqn) -> str:
    return f"eqn {i} `{format_eqn(eqn, with_source=False)}`" + (f" from {eqn.source}" if eqn.source else "")


def _run_eqn(
    i: int, eqn: Eqn, rule: Any, env: dict[int, torch.Tensor], sizes: dict[str, int], device: torch.device
) -> None:
    try:
        result = rule(eqn.params, *(_value(a, env, device) for a in eqn.inputs))
    except ExecutionError:
        raise
    except Exception as exc:
        raise ExecutionError(f"{where(i, eqn)}: {type(exc).__name__}: {exc}") from exc
    results = result if isinstance(result, tuple) else (result,)
    if len(results) != len(eqn.outputs):
        raise ExecutionError(
            f"{where(i, eqn)}: rule returned {len(results)} values for {len(eqn.outputs)} outputs"
        )
    check_results(i, eqn, results, sizes)
    for out, value in zip(eqn.outputs, results, strict=True):
        env[out.id] = value


def check_results(i: int, eqn: Eqn, results: Sequence[Any], sizes: dict[str, int]) -> None:
    """A rule's results against its equation's output types (ExecutionError names the equation)."""
    for out, value in zip(eqn.outputs, results, strict=True):
        try:
            bind(out.type, value, sizes, "output")
        except ExecutionError as exc:
            raise ExecutionError(f"{where(i, eqn)}: {exc}") from None


def run_program(
    program: Program, args: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Execute; `args` by input name or in input order. Returns outputs by name."""
    graph: Graph = program.graph
    if isinstance(args, Mapping):
        missing = [n for n in graph.input_names if n not in args]
        extra = [n for n in args if n not in graph.input_names]
        if missing or extra:
            raise ExecutionError(f"graph {graph.name}: missing inputs {missing}, unexpected inputs {extra}")
        values = [args[n] for n in graph.input_names]
    else:
        values = list(args)
        if len(values) != len(graph.inputs):
            raise ExecutionError(f"graph {graph.name}: takes {len(graph.inputs)} inputs, got {len(values)}")
    env: dict[int, torch.Tensor] = {}
    sizes: dict[str, int] = {}
    for var, name, value in zip(graph.inputs, graph.input_names, values, strict=True):
        bind(var.type, value, sizes, f"graph {graph.name}: input {name}")
        env[var.id] = value
    # literals go where the inputs are (a device-agnostic rule may combine them with any operand)
    device = values[0].device if values else torch.device("cpu")
    if not program.is_concrete:  # lowered with symbolic dims: shape params may hold them,
        # so run the graph specialized to the sizes the inputs bound
        program = lower(specialize(graph, sizes), program.source or program.platform)
    for i, step in enumerate(program.steps):
        _run_eqn(i, step.eqn, step.rule, env, sizes, device)
    return {n: _value(a, env, device) for a, n in zip(graph.outputs, graph.output_names, strict=True)}


def run_graph(
    graph: Graph, args: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Lower onto cpu and execute once (tests and tools; sessions keep the lowered program)."""
    return run_program(lower(graph, "cpu"), args)


__all__ = ["ExecutionError", "Var", "bind", "check_results", "literal", "run_graph", "run_program", "where"]
