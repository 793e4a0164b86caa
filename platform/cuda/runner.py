"""The cuda platform's bucketed runner: each bucket's concrete program is bound to the device once
(`execute.DeviceProgram`) and either run eagerly, equation by equation, or captured once into CUDA graphs
(`capture.CapturedStep`: static input buffers, one host-to-device copy per dtype) and replayed. Every
capture of one runner shares one CUDA-graph memory pool. Cache writes are in place, so the caches a step
returns are the cache buffers themselves (any that is not is copied in, without a host sync).

On a cpu device (tests without a GPU) the same runner runs, its captured pieces re-running their steps
into the buffers recorded at capture (capture.py), so the bucketing and staging logic is testable
anywhere.

Replay from C++: each capture is registered with the native runtime's `ReplayTable` (runtime/csrc/
graph_replay.h) under its bucket's sizes, as its phases: the cudaGraphExec_t of every captured piece
(launched with the driver's cuGraphLaunch on the current stream) and, between them, the eager steps as
host callbacks. A replayed step is then one call into C++, which finds the bucket and launches all of its
phases. On a cpu device every phase is a callback (the pieces' re-runs), so the same entry is tested
without a GPU. DSGRAPH_NATIVE_REPLAY=0 replays each piece from Python instead (measurements).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from dsgraph.platform.cuda.capture import CapturedStep, Piece, adopt_verdicts, probed_verdicts
from dsgraph.platform.cuda.execute import DeviceProgram
from dsgraph.platform.registry import Key, Platform, Program


def _on(value: Any, device: torch.device) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))
    return tensor.to(device)


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


class Runner:
    def __init__(
        self,
        platform: Platform,
        device: torch.device,
        replay_table: Any = None,
        *,
        side_stream: bool | None = None,
    ) -> None:
        """`side_stream`: each bucket's DeviceProgram hoists its host-table gathers onto a side stream
        (None: DSGRAPH_SIDE_STREAM)."""
        self.platform, self.name, self.device = platform, platform.name, device
        self.side_stream = side_stream
        self.programs: dict[Key, DeviceProgram] = {}
        self.captured: dict[Key, CapturedStep] = {}
        self.captures = 0
        self.last_captured = False  # whether the last run recorded its bucket (its time includes that)
        self.pool: Any = None
        self.pads = True
        self.table = replay_table
        self.native_keys: dict[Key, list[int]] = {}  # bucket -> its key in the native table
        self._index = None if device.type != "cuda" else _device_index(device)

    def capture_facts(self) -> dict[str, Any]:
        """What capturing found out that a start from a bundle can reuse: which rules can be captured."""
        return {"verdicts": probed_verdicts()}

    def adopt_capture_facts(self, facts: Mapping[str, Any]) -> None:
        adopt_verdicts(facts.get("verdicts", {}))

    def program(self, key: Key, lower: Callable[[], Program]) -> DeviceProgram:
        if key not in self.programs:
            self.programs[key] = DeviceProgram(lower(), self.device, side_stream=self.side_stream)
        return self.programs[key]

    def bucket(self, n: int) -> int:
        """The next power of two (at least 1): few buckets, so few programs and captures."""
        return 1 << max(n - 1, 0).bit_length()

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
        program = self.program(key, lower)
        extra = extra or {}
        self.last_captured = False
        if not capture:  # eager: every rule launched from the host
            tensors = {k: _on(v, self.device) for k, v in inputs.items()}
            if before is not None:
                before(tensors)
            return program.run({**fixed, **{k: v for k, v in tensors.items() if k not in extra}})
        captured = self._captured(key, program, fixed, padding, extra)
        captured.inputs.stage(inputs)
        if before is not None:  # device to device, on the stream the replay follows
            before(captured.inputs.tensors)
        if self.table is None:
            captured.launch()
        else:
            self.table.launch(self.native_keys[key], self._stream())
            captured.replays += 1
        return captured.outputs

    def _stream(self) -> int:
        # the raw handle without building a torch Stream object: this is on every replayed step
        return torch._C._cuda_getCurrentRawStream(self._index) if self._index is not None else 0

    def _captured(
        self,
        key: Key,
        program: DeviceProgram,
        fixed: Mapping[str, torch.Tensor],
        padding: Callable[[], Mapping[str, Any]] | None,
        extra: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    ) -> CapturedStep:
        """The bucket's capture, recorded on its first run over an all-padding step."""
        if key not in self.captured:
            if padding is None:
                raise ValueError(f"bucket {key}: capturing needs the bucket's all-padding step")
            if self.pool is None and self.device.type == "cuda":
                self.pool = torch.cuda.graph_pool_handle()
            captured = CapturedStep(program, fixed, padding(), pool=self.pool, extra=extra)
            if self.table is not None:
                self.native_keys[key] = native_key(key)
                self.table.add(self.native_keys[key], native_phases(captured))
            self.captured[key] = captured
            self.captures += 1
            self.last_captured = True
        return self.captured[key]

    def keep_caches(self, caches: dict[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> None:
        for name, buffer in caches.items():
            value = outputs[f"caches.{name}"]
            if value.data_ptr() != buffer.data_ptr():
                buffer.copy_(value)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"


def native_key(key: Key) -> list[int]:
    """The ints of a bucket key in order (its sizes, and a variant's tag), the native table's key."""
    if isinstance(key, bool | int):
        return [int(key)]
    if isinstance(key, tuple):
        return [i for part in key for i in native_key(part)]
    return []


def native_phases(captured: CapturedStep) -> list[int | Callable[[], None]]:
    """A capture's phases for the native table: graph exec handles, eager steps as callbacks."""
    return [
        p.graph.raw_cuda_graph_exec() if isinstance(p, Piece) and p.graph is not None else p.replay
        for p in captured.phases
    ]
