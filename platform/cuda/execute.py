"""Running a lowered, concrete Program on a device, equation by equation (the eager path; `capture.py`
records the same steps into CUDA graphs).

Literals are materialized on the device once. Operands a platform writes in place (`Platform.inplace`:
the cuda cache writes) end up in the operand's own buffer, so caches passed as graph inputs are updated
where they live and the graph's cache outputs are those same tensors. A value is dropped after its last
use, so a step holds only its live intermediates.

The equations that gather rows from host-resident Engram tables (and the hashing they need) are moved to
the front and, on a CUDA device, run on a side stream, with an event per hoisted equation that the main
stream waits on before their first reader (`side_stream.py`): their PCIe reads overlap the earlier
layers. `join()` makes the main stream wait for the side stream; `run` and each captured piece end with
it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from dsgraph.graph.ir import Lit, Var
from dsgraph.platform import env as dsgraph_env
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.interpret import ExecutionError, bind, check_results, literal, where
from dsgraph.platform.cuda.side_stream import SidePlan, plan_side_stream, reorder
from dsgraph.platform.registry import Program

Operand = int | torch.Tensor  # a value id, or a literal already on the device


class DeviceUnavailable(ValueError):
    """The platform's device is not present on this machine (a clear message instead of torch's)."""


def resolve_device(device: torch.device | str) -> torch.device:
    """`device` with its index: "cuda" means the current CUDA device (tensors report "cuda:N").
    DeviceUnavailable names the platform when no CUDA device is visible."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise DeviceUnavailable(
            f"platform: 'cuda' is not available here: no CUDA device is visible (torch {torch.__version__}, "
            f"{build}); use platform 'cpu' (--platform cpu) on this machine"
        )
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

    def __init__(
        self, program: Program, device: torch.device | str, *, side_stream: bool | None = None
    ) -> None:
        """`side_stream`: hoist the host-table gathers (see the module doc); False keeps the program's order
        on one stream; None: on unless DSGRAPH_SIDE_STREAM=0."""
        if side_stream is None:
            side_stream = dsgraph_env.side_stream()
        graph = program.graph
        if not program.is_concrete:
            raise ExecutionError(
                f"program {graph.name}: symbolic dims {sorted(graph.symbols)}; specialize the graph to a "
                "bucket before running it on a device"
            )
        plan = (
            plan_side_stream(program)
            if side_stream
            else SidePlan(tuple(range(len(program.steps))), frozenset(), {})
        )
        program, self.plan = reorder(program, plan)
        self.program, self.graph, self.device = program, graph, resolve_device(device)
        self.streams = _Streams(self.plan, self.device)
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
        self.streams.reset()
        return env

    def args_of(self, i: int, env: Mapping[int, torch.Tensor]) -> list[torch.Tensor]:
        return [env[o] if isinstance(o, int) else o for o in self.operands[i]]

    def run_step(self, i: int, env: dict[int, torch.Tensor], *, check: bool = True) -> list[torch.Tensor]:
        """Step i on `env`: its outputs bound and returned (in-place outputs are their operand's tensor),
        dead values dropped. `check`: output types are verified (shapes and dtypes: no host sync)."""
        with self.streams.around(i) as side_outputs:
            eqn, rule = self.program.steps[i].eqn, self.program.steps[i].rule
            operands = self.args_of(i, env)
            results = call_rule(i, eqn, rule, operands)
            if check:
                check_results(i, eqn, results, {})
            for out, value in zip(eqn.outputs, write_back(results, operands, self.inplace[i]), strict=True):
                env[out.id] = value
            side_outputs.extend(results)
        for vid in self.dead[i]:
            env.pop(vid, None)
        return results

    def join(self) -> None:
        """The current stream waits for every hoisted step launched since the last join (no-op on cpu)."""
        self.streams.join()

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
        self.join()
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


class _Streams:
    """The side stream of a DeviceProgram and the events of one run (see the module doc). On a cpu device,
    or with nothing hoisted, every step runs on the current stream."""

    def __init__(self, plan: SidePlan, device: torch.device) -> None:
        self.plan, self.signals = plan, plan.signals
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" and plan.side else None
        self.events: dict[int, torch.cuda.Event] = {}
        self.forked = False

    def reset(self) -> None:
        self.events.clear()
        self.forked = False

    @contextmanager
    def around(self, i: int) -> Iterator[list[torch.Tensor]]:
        """Runs step i's body on its stream; yields a list the body fills with the step's results."""
        results: list[torch.Tensor] = []
        if self.stream is None:
            yield results
            return
        main = torch.cuda.current_stream(self.stream.device)
        if i not in self.plan.side:
            for h in self.plan.waits.get(i, ()):
                event = self.events.pop(h, None)
                if event is not None:  # None: launched before the last join, already ordered
                    main.wait_event(event)
            yield results
            return
        if not self.forked:  # the step's inputs were written on the main stream
            self.stream.wait_stream(main)
            self.forked = True
        with torch.cuda.stream(self.stream):
            yield results
            if i in self.signals:
                event = torch.cuda.Event()
                event.record(self.stream)
                self.events[i] = event
                for t in results:  # read on the main stream: not reused before that read is done
                    t.record_stream(main)

    def join(self) -> None:
        if self.stream is not None and self.forked:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        self.reset()
