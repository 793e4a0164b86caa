"""Running a lowered, concrete Program on a device, equation by equation (the eager path; `capture.py`
records the same steps into CUDA graphs).

Literals are materialized on the device once. Operands a platform writes in place (`Platform.inplace`:
the cuda cache writes) end up in the operand's own buffer, so caches passed as graph inputs are updated
where they live and the graph's cache outputs are those same tensors. A value is dropped after its last
use, so a step holds only its live intermediates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dsgraph.graph.ir import Lit, Var
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.interpret import ExecutionError, bind, check_results, literal, where
from dsgraph.platform.registry import Program

Operand = int | torch.Tensor  # a value id, or a literal already on the device


def resolve_device(device: torch.device | str) -> torch.device:
    """`device` with its index: "cuda" means the current CUDA device (tensors report "cuda:N")."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _last_uses(program: Program) -> tuple[tuple[int, ...], ...]:
    """Per step, the value ids whose last reader it is, or that it produces and nobody reads (graph
    outputs are never released)."""
    last: dict[int, int] = {}
    for i, step in enumerate(program.steps):
        for a in step.eqn.inputs:
            if isinstance(a, Var):
                last[a.id] = i
        for out in step.eqn.outputs:
            last.setdefault(out.id, i)
    keep = {a.id for a in program.graph.outputs if isinstance(a, Var)}
    dead: list[list[int]] = [[] for _ in program.steps]
    for vid, i in last.items():
        if vid not in keep:
            dead[i].append(vid)
    return tuple(tuple(d) for d in dead)


class DeviceProgram:
    """A concrete Program bound to one device (see the module doc)."""

    def __init__(self, program: Program, device: torch.device | str) -> None:
        graph = program.graph
        if program.memory is None:
            raise ExecutionError(
                f"program {graph.name}: symbolic dims {sorted(graph.symbols)}; specialize the graph to a "
                "bucket before running it on a device"
            )
        self.program, self.graph, self.device = program, graph, resolve_device(device)
        self.inplace: tuple[tuple[tuple[int, int], ...], ...] = tuple(
            program.inplace[s.eqn.op](s.eqn) if s.eqn.op in program.inplace else () for s in program.steps
        )
        self.operands: tuple[tuple[Operand, ...], ...] = tuple(
            tuple(literal(a, self.device) if isinstance(a, Lit) else a.id for a in s.eqn.inputs)
            for s in program.steps
        )
        self.dead = _last_uses(program)

    def bind(self, args: Mapping[str, torch.Tensor]) -> dict[int, torch.Tensor]:
        """The environment of the graph inputs; names, types and the device are checked."""
        names = self.graph.input_names
        missing = [n for n in names if n not in args]
        extra = [n for n in args if n not in names]
        if missing or extra:
            raise ExecutionError(
                f"graph {self.graph.name}: missing inputs {missing}, unexpected inputs {extra}"
            )
        env: dict[int, torch.Tensor] = {}
        for var, name in zip(self.graph.inputs, names, strict=True):
            value = args[name]
            bind(var.type, value, {}, f"graph {self.graph.name}: input {name}")
            if value.device != self.device:
                raise ExecutionError(
                    f"graph {self.graph.name}: input {name} is on {value.device}, expected {self.device}"
                )
            env[var.id] = value
        return env

    def args_of(self, i: int, env: Mapping[int, torch.Tensor]) -> list[torch.Tensor]:
        return [env[o] if isinstance(o, int) else o for o in self.operands[i]]

    def run_step(self, i: int, env: dict[int, torch.Tensor], *, check: bool = True) -> list[torch.Tensor]:
        """Step i on `env`: its outputs bound and returned (in-place outputs are their operand's tensor),
        dead values dropped. `check`: output types are verified (shapes and dtypes: no host sync)."""
        eqn, rule = self.program.steps[i].eqn, self.program.steps[i].rule
        operands = self.args_of(i, env)
        results = call_rule(i, eqn, rule, operands)
        if check:
            check_results(i, eqn, results, {})
        for out, value in zip(eqn.outputs, write_back(results, operands, self.inplace[i]), strict=True):
            env[out.id] = value
        for vid in self.dead[i]:
            env.pop(vid, None)
        return results

    def outputs(self, env: Mapping[int, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            n: env[a.id] if isinstance(a, Var) else literal(a, self.device)
            for a, n in zip(self.graph.outputs, self.graph.output_names, strict=True)
        }

    def run(self, args: Mapping[str, torch.Tensor], *, check: bool = True) -> dict[str, torch.Tensor]:
        """Execute eagerly; returns the outputs by name (cache outputs alias the cache inputs)."""
        env = self.bind(args)
        for i in range(len(self.program.steps)):
            self.run_step(i, env, check=check)
        return self.outputs(env)

    def empty_outputs(self, i: int, env: Mapping[int, torch.Tensor]) -> list[torch.Tensor]:
        """Buffers for step i's outputs without running it: in-place outputs are their operand's tensor."""
        eqn = self.program.steps[i].eqn
        outs = [
            torch.empty([int(d) for d in o.type.shape], dtype=to_torch(o.type.dtype), device=self.device)
            for o in eqn.outputs
        ]
        operands = self.args_of(i, env)
        for operand, out in self.inplace[i]:
            outs[out] = operands[operand]
        return outs


def call_rule(i: int, eqn: Any, rule: Any, operands: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The rule's results as a list; a failure is an ExecutionError naming the equation."""
    try:
        result = rule(eqn.params, *operands)
    except ExecutionError:
        raise
    except Exception as exc:
        raise ExecutionError(f"{where(i, eqn)}: {type(exc).__name__}: {exc}") from exc
    results = list(result) if isinstance(result, tuple) else [result]
    if len(results) != len(eqn.outputs):
        raise ExecutionError(
            f"{where(i, eqn)}: rule returned {len(results)} values for {len(eqn.outputs)} outputs"
        )
    return results


def write_back(
    results: list[torch.Tensor], operands: Sequence[torch.Tensor], pairs: tuple[tuple[int, int], ...]
) -> list[torch.Tensor]:
    """In-place outputs land in their operand's buffer (copied there if a rule returned a new tensor)."""
    for operand, out in pairs:
        target = operands[operand]
        if results[out] is not target:
            target.copy_(results[out])
            results[out] = target
    return results
