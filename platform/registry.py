"""Platforms: a table of (op name -> rule) each, and lowering a graph onto one.

A platform is a module `dsgraph.platform.<name>.target` with a `PLATFORM` object. A missing rule is
an error at lowering time that names the op, the equation, the platform and its registered ops.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dsgraph.graph.ir import Eqn, Graph
from dsgraph.graph.passes.memory import MemoryPlan, plan_memory
from dsgraph.graph.printer import format_eqn

Rule = Callable[..., Any]
PLATFORM_NAMES = ("cpu", "null")


class LoweringError(RuntimeError):
    """A graph uses an op the platform has no rule for, or the platform does not exist."""


@dataclass(frozen=True)
class Platform:
    name: str
    rules: Mapping[str, Rule]
    executes: bool = True
    # op name -> why it is not lowered here (an explicit gap, checked by the coverage test)
    unsupported: Mapping[str, str] = field(default_factory=dict)

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
    """A graph lowered onto one platform: one step per equation, and the arena plan if concrete."""

    graph: Graph
    platform: str
    steps: tuple[LoweredStep, ...]
    memory: MemoryPlan | None

    def as_text(self) -> str:
        lines = [f"program {self.graph.name} on {self.platform}: {len(self.steps)} steps"]
        for i, step in enumerate(self.steps):
            lines.append(f"  [{i}] {step.eqn.op:<16} -> {_rule_name(step.rule)}")
        text = "\n".join(lines) + "\n"
        return text + (self.memory.as_text() if self.memory else "memory: not planned (symbolic dims)\n")


def _rule_name(rule: Rule) -> str:
    return (
        f"{getattr(rule, '__module__', '?').rsplit('.', 1)[-1]}.{getattr(rule, '__qualname__', repr(rule))}"
    )


def get_platform(name: str) -> Platform:
    if name not in PLATFORM_NAMES:
        raise LoweringError(f"unknown platform {name!r}; known: {list(PLATFORM_NAMES)}")
    return importlib.import_module(f"dsgraph.platform.{name}.target").PLATFORM


def lower(graph: Graph, platform: Platform | str) -> Program:
    plat = get_platform(platform) if isinstance(platform, str) else platform
    where = f"graph {graph.name}, "
    steps = tuple(LoweredStep(e, plat.rule_for(e, f"{where}eqn {i} ")) for i, e in enumerate(graph.eqns))
    concrete = not graph.symbols
    return Program(graph, plat.name, steps, plan_memory(graph) if concrete else None)
