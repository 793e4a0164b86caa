"""Platforms: a table of (op name -> rule) each, and lowering a graph onto one.

A platform is a module `dsgraph.platform.<name>.target` with a `PLATFORM` object. A missing rule is
an error at lowering time that names the op, the equation, the platform and its registered ops.

A platform whose rules write some operands in place (the cuda platform's cache writes) declares them in
`inplace`; lowering then orders the graph so that no equation reads an overwritten value afterwards, or
fails naming the equations (`platform/inplace.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import torch

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
    # lowering merges the equation pairs that have a fused op (platform/fusion.py): for a platform whose
    # kernels run each pair as one launch
    fuse: bool = False

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
    if plat.fuse:
        from dsgraph.platform.fusion import fuse

        graph = fuse(graph)
    if plat.inplace:
        from dsgraph.platform.inplace import order_for_inplace

        graph = order_for_inplace(graph, plat)
    steps = tuple(LoweredStep(e, plat.rule_for(e, f"{where}eqn {i} ")) for i, e in enumerate(graph.eqns))
    return Program(graph, plat.name, steps, plat.fallbacks, plat.inplace, plat.kernels, plat)


# What the runtime asks of a platform. `runtime/` imports no platform module but this one
# (tests/unit/test_runtime_platform_free.py); the functions below resolve the platform's own module when
# called, so importing the registry loads no platform.

Key = Hashable  # a bucket: the concrete sizes a program was specialized to (and any variant tag)


class BucketRunner(Protocol):
    """One platform's execution of bucketed programs (`platform/<name>/runner.py`): a bucket's program is
    bound to the runner's device once and run eagerly, or captured once and replayed.

    `run(key, lower, fixed, inputs)`: `lower()` gives the bucket's concrete Program (called on the key's
    first run only); `fixed` are the persistent graph inputs (weights, caches) by name; `inputs` the step's
    graph inputs by name plus `extra` staged tensors that are no graph input. `before(tensors)` sees the
    step's tensors on the device after staging and may change them in place (the overlapped-step input
    fix). With `capture` (a device platform) the bucket is recorded on its first run over `padding()`
    (an all-padding step of the bucket, extras included) and replayed after. Returns the outputs by
    name; a replayed bucket's are its static buffers, valid until its next run."""

    name: str
    device: torch.device
    captured: dict[Key, Any]  # key -> the bucket's capture (its `as_text()` lists graphs and eager steps)
    captures: int
    last_captured: bool  # whether the last run recorded its bucket (its time includes the capture)
    pads: bool  # whether `bucket` pads sizes (step time is then a step function of the size)

    def bucket(self, n: int) -> int:
        """The size a step dim of `n` runs at (padded to it)."""

    def program(self, key: Key, lower: Callable[[], Program]) -> Any:
        """The bucket's program as this runner executes it (lowered on the key's first use)."""

    def capture_facts(self) -> dict[str, Any]:
        """JSON-able facts capturing learnt (which rules can be captured) that a bundle keeps."""

    def adopt_capture_facts(self, facts: Mapping[str, Any]) -> None:
        """Takes a bundle's `capture_facts` instead of finding them out again."""

    def run(
        self,
        key: Key,
        lower: Callable[[], Program],
        fixed: Mapping[str, torch.Tensor],
        inputs: Mapping[str, Any],
        *,
        capture: bool = False,
        padding: Callable[[], Mapping[str, Any]] | None = None,
        extra: Mapping[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
        before: Callable[[dict[str, torch.Tensor]], None] | None = None,
    ) -> dict[str, torch.Tensor]: ...

    def keep_caches(self, caches: dict[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> None:
        """Make `caches` (name -> tensor) hold the step's `caches.<name>` outputs."""

    def synchronize(self) -> None:
        """Wait for all work the runner launched (timing)."""

    def device_name(self) -> str:
        """The device's name (keys of cached measurements)."""


def make_runner(
    platform: Platform | str,
    device: torch.device | str | None = None,
    replay_table: Any = None,
    *,
    side_stream: bool | None = None,
) -> BucketRunner:
    """The platform's bucketed runner on `device` (default: the platform's own device). `replay_table`:
    the native runtime's table that launches captured buckets (the runtime passes it in, so that
    platform/ never imports runtime/); None replays from Python. `side_stream`: whether a platform with
    host-resident tables reads them on a side stream (None: DSGRAPH_SIDE_STREAM; ignored elsewhere)."""
    plat = get_platform(platform) if isinstance(platform, str) else platform
    if not plat.executes:
        raise LoweringError(f"platform {plat.name!r} does not execute programs (it only lowers them)")
    module = importlib.import_module(f"dsgraph.platform.{plat.name}.runner")
    device = resolve_device(plat.name if device is None else device)
    return module.Runner(plat, device, replay_table, side_stream=side_stream)


def platform_name(platform: Platform | str) -> str:
    return platform if isinstance(platform, str) else platform.name


def platform_of(device: torch.device) -> str:
    """The platform whose programs run on tensors of `device` (sampling follows its logits)."""
    return "cuda" if device.type == "cuda" else "cpu"


def resolve_device(device: torch.device | str) -> torch.device:
    """`device` with its index; `DeviceUnavailable` (a ValueError naming the platform) when absent."""
    from dsgraph.platform.cuda.execute import resolve_device as resolve

    return resolve(device)


def place_weights(
    weights: Mapping[str, torch.Tensor], device: torch.device, host_min_bytes: int | None = None
) -> dict[str, torch.Tensor]:
    """Every weight on `device`; on a CUDA device the Engram tables of >= host_min_bytes stay in pinned
    host memory (`platform/cuda/placement.py`)."""
    from dsgraph.platform.cuda.placement import place_weights as place

    return place(weights, device, host_min_bytes)


def host_table_min_bytes(name: str, device: torch.device | str, min_bytes: int | None = None) -> int | None:
    """The size from which weight `name` stays in host memory on `device`; None: it never does."""
    from dsgraph.platform.cuda import placement

    if torch.device(device).type != "cuda" or not placement.is_host_table(name):
        return None
    return placement.host_min_bytes(min_bytes)


def is_host_table(name: str) -> bool:
    """Whether weight `name` is one the cuda platform may keep in host memory (an Engram table or its
    scales): such tables are shared between the rank processes of a node."""
    from dsgraph.platform.cuda.placement import is_host_table as host_table

    return host_table(name)


def pin_host(t: torch.Tensor) -> torch.Tensor:
    """`t` in page-locked host memory (where the cuda platform reads a host-resident table)."""
    from dsgraph.platform.cuda.placement import pin_in_place

    return pin_in_place(t)


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a graph dtype name."""
    from dsgraph.platform.cpu.dtypes import to_torch

    return to_torch(dtype)


def cache_entry_bytes(head_dim: int, index_head_dim: int) -> int:
    """Bytes of one compressed cache entry: an NVFP4-g16 head entry and an MXFP4-g32 index-key entry."""
    from dsgraph.platform.cpu.cache_format import mxfp4_g32_entry_bytes, nvfp4_g16_entry_bytes

    return nvfp4_g16_entry_bytes(head_dim) + mxfp4_g32_entry_bytes(index_head_dim)
