"""Platforms: a table of (op name -> rule) each, and lowering a graph onto one.

A platform is a module `dsgraph.platform.<name>.target` with a `PLATFORM` object. A missing rule is
an error at lowering time that names the op, the equation, the platform and its registered ops.

A platform whose rules write some operands in place (the cuda platform's cache writes) declares them in
`inplace`; lowering then orders the graph so that no equation reads an overwritten value afterwards, or
fails naming the equations (`platform/inplace.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dsgraph.graph.ir import Eqn, Graph
from dsgraph.graph.passes.memory import MemoryPlan, plan_memory
from dsgraph.graph.printer import format_eqn

Rule = Callable[..., Any]
PLATFORM_NAMES = ("cpu", "null", "cuda")
# op -> eqn -> (operand index, output index) pairs whose output aliases (overwrites) that operand
Inplace = Callable[[Eqn], tuple[tuple[int, int], ...]]


class LoweringError(RuntimeError):
    """A graph uses an op the platform has no rule for, or the platform does not exist."""


@dataclass(frozen=True)
class Platform:
    name: str
    rules: Mapping[str, Rule]
    executes: bool = True
    # op name -> why it is not lowered here (an explicit gap, checked by the coverage test)
    unsupported: Mapping[str, str] = field(default_factory=dict)
    # op name -> why its rule is not the platform's preferred one (e.g. a kernel module failed to import)
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    inplace: Mapping[str, Inplace] = field(default_factory=dict)
    # op name -> the device kernels its rule may launch (shown by Program.as_text; the cuda platform's)
    kernels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def rule_for(self, eqn: Eqn, where: str = "") -> Rule:
        rule = self.rules.get(eqn.op)
        if rule is not None:
            return rule
        why = self.unsupported.get(eqn.op, "no rule registered")
        raise LoweringError(
            f"op '{eqn.op}' has no lowering rule on platform '{self.name}' ({why}); "
            f"at {where}`{format_eqn(eqn, with_source=False)}`{' from ' + eqn.source if eqn.source else ''}; "
            f"registered ops: {sorted(self.rules)}"
        )


@dataclass(frozen=True)
class LoweredStep:
    eqn: Eqn
    rule: Rule


@dataclass(frozen=True)
class Program:
    """A graph lowered onto one platform: one step per equation. `memory` is the arena plan of a concrete
    program, for analysis only (see `memory`)."""

    graph: Graph
    platform: str
    steps: tuple[LoweredStep, ...]
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    inplace: Mapping[str, Inplace] = field(default_factory=dict)
    kernels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the platform it was lowered onto, for re-lowering a symbolic program onto the same rules (an
    # expert-parallel group's platform binds its own collective rules: runtime/distributed)
    source: Platform | None = field(default=None, compare=False, repr=False)

    @property
    def is_concrete(self) -> bool:
        """Whether every dim is a number (a bucket): only a concrete program runs on a device."""
        return not self.graph.symbols

    @cached_property
    def memory(self) -> MemoryPlan | None:
        """The liveness plan of one arena for every intermediate value (None with symbolic dims). Analysis
        only: no platform allocates from it (the cpu interpreter and the cuda programs take each value from
        torch's allocator, a captured bucket from its CUDA-graph pool). `dsgraph inspect` and the goldens
        print it, `dsgraph plan` sizes activations with it; it is computed when first read, so lowering a
        bucket does not pay for it."""
        return plan_memory(self.graph) if self.is_concrete else None

    def as_text(self) -> str:
        lines = [f"program {self.graph.name} on {self.platform}: {len(self.steps)} steps"]
        for i, step in enumerate(self.steps):
            why = self.fallbacks.get(step.eqn.op)
            note = f"  (fallback: {why})" if why else ""
            launches = self.kernels.get(step.eqn.op)
            if launches is not None:
                note += f"  launches: {', '.join(launches) or 'torch operations only'}"
            lines.append(f"  [{i}] {step.eqn.op:<16} -> {_rule_name(step.rule)}{note}")
        used = sorted({s.eqn.op for s in self.steps} & set(self.fallbacks))
        lines += [f"fallback {op}: {self.fallbacks[op]}" for op in used]
        text = "\n".join(lines) + "\n"
        if self.memory is None:
            return text + "memory: not planned (symbolic dims)\n"
        return text + "memory plan (analysis only, nothing allocates from it): " + self.memory.as_text()


def _rule_name(rule: Rule) -> str:
    module = getattr(rule, "__module__", "?").removeprefix("dsgraph.platform.")
    # cpu rules keep their short name (golden dumps); other platforms' rules name their module path
    short = module.rsplit(".", 1)[-1] if module.startswith("cpu.") else module
    return f"{short}.{getattr(rule, '__qualname__', repr(rule))}"


def get_platform(name: str) -> Platform:
    if name not in PLATFORM_NAMES:
        raise LoweringError(f"unknown platform {name!r}; known: {list(PLATFORM_NAMES)}")
    return importlib.import_module(f"dsgraph.platform.{name}.target").PLATFORM


def lower(graph: Graph, platform: Platform | str) -> Program:
    plat = get_platform(platform) if isinstance(platform, str) else platform
    where = f"graph {graph.name}, "
    if plat.inplace:
        from dsgraph.platform.inplace import order_for_inplace

        graph = order_for_inplace(graph, plat)
    steps = tuple(LoweredStep(e, plat.rule_for(e, f"{where}eqn {i} ")) for i, e in enumerate(graph.eqns))
    return Program(graph, plat.name, steps, plat.fallbacks, plat.inplace, plat.kernels, plat)
