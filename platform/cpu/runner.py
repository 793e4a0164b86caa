"""The cpu platform's bucketed runner: every bucket's program runs in the interpreter (interpret.py) on
the step's tensors as given. Nothing is captured; caches are functional (a step returns new cache
tensors, which replace the old ones)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from dsgraph.platform.cpu.interpret import run_program
from dsgraph.platform.registry import Key, Platform, Program


def as_tensor(value: Any) -> torch.Tensor:
    """A step input as a tensor of its own (a host array is copied: the input fix writes in place)."""
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))


class Runner:
    def __init__(self, platform: Platform, device: torch.device, replay_table: Any = None, **_: Any) -> None:
        """`replay_table` and the device options (`side_stream`) are unused: the interpreter captures
        nothing to replay and runs every step on one stream."""
        self.platform, self.name, self.device = platform, platform.name, device
        self.programs: dict[Key, Program] = {}
        self.captured: dict[Key, Any] = {}  # never filled: the interpreter has nothing to capture
        self.captures = 0
        self.last_captured = False
        self.pads = False

    def bucket(self, n: int) -> int:
        """Steps run at their own sizes: a program per distinct size costs only its lowering here."""
        return n

    def capture_facts(self) -> dict[str, Any]:
        """Nothing is captured here, so nothing is learnt for a bundle."""
        return {}

    def adopt_capture_facts(self, facts: Mapping[str, Any]) -> None:
        del facts

    def program(self, key: Key, lower: Callable[[], Program]) -> Program:
        if key not in self.programs:
            self.programs[key] = lower()
        return self.programs[key]

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
    ) -> dict[str, torch.Tensor]:
        del capture, padding  # every run is eager
        program = self.program(key, lower)
        tensors = {k: as_tensor(v) for k, v in inputs.items()}
        if before is not None:
            before(tensors)
        extra = extra or {}
        args = {**fixed, **{k: v for k, v in tensors.items() if k not in extra}}
        return run_program(program, args)

    def keep_caches(self, caches: dict[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> None:
        for name in caches:
            caches[name] = outputs[f"caches.{name}"]

    def synchronize(self) -> None:
        """Nothing runs asynchronously on the cpu."""

    def device_name(self) -> str:
        return "cpu"
