"""CUDA-graph capture of one bucket's program, and its replay.

`CapturedStep` holds, for one bucket (the concrete sizes of tokens/seqs/outs), static device buffers for
the step inputs (plus `extra` staged buffers that are not graph inputs, e.g. the runtime's input-fix
source rows) and records the whole program once; `replay(step)` copies the step's inputs in with one
host-to-device copy per dtype (from one pinned buffer) and replays, returning the static logits buffer
without a host sync. Weights and caches are the persistent tensors the caller passed; cache writes are
in place, so replays update them.

A rule that cannot be captured (it reads values on the host or makes data-dependent shapes, like the
cpu rules of the cache writes, MoE dispatch and compressed attention; `capturable` says which, from a
fake-tensor probe) splits the program: the steps between such rules are captured as separate graphs
sharing one memory pool, and the rule itself runs eagerly between their replays on the same static
tensors. With every rule capturable (Triton kernels) the program is one graph. The hoisted Engram steps
(execute.py) are captured on their side stream, forked from and joined back into the capture stream
within one piece; an eager step replays on the current stream.

The capture records an all-padding step (`padding`: rows with seq_id -1, which write no cache entry),
after an eager warm-up with the same step, so capturing never changes a cache. Value checks of the rules
run in the warm-up and in the eager pieces; captured pieces run unchecked (`step_rows.unchecked`).

On a cpu device (tests without a GPU) a "graph" re-runs its steps and copies their results into the
buffers recorded at capture, so the staging, splitting and static-buffer logic is testable anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from dsgraph.graph.ir import Eqn, Var
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.interpret import ExecutionError, where
from dsgraph.platform.cpu.step_rows import unchecked
from dsgraph.platform.cuda.execute import DeviceProgram, call_rule, write_back
from dsgraph.platform.registry import LoweredStep

_PROBED: dict[tuple[Any, ...], tuple[bool, str]] = {}
_ADOPTED: dict[str, tuple[bool, str]] = {}  # verdicts read from a bundle, by the text of their key


class _NoSuchError(Exception):
    """Stands in for an exception class this torch version does not have (never raised)."""


def capturable(step: LoweredStep) -> tuple[bool, str]:
    """(whether the step's rule can run inside a CUDA-graph capture, why). A rule may say so itself with
    a `capturable` attribute; Triton kernel rules (`platform/cuda/kernels/`) are taken as capturable; any
    other rule (torch code) is run once on fake CUDA tensors of the equation's types, without checks: it
    is capturable unless it needs a value on the host or a data-dependent shape."""
    declared = getattr(step.rule, "capturable", None)
    if declared is not None:
        return bool(declared), "declared by the rule"
    if getattr(step.rule, "__module__", "").startswith("dsgraph.platform.cuda.kernels."):
        return True, "kernel rule"
    eqn = step.eqn
    key = (eqn.op, eqn.params, tuple(a.type if isinstance(a, Var) else a for a in eqn.inputs))
    try:
        hash(key)
    except TypeError:  # unhashable params: probe every time
        return _probe(step)
    if key not in _PROBED:
        _PROBED[key] = (_ADOPTED and _ADOPTED.get(repr(key))) or _probe(step)
    return _PROBED[key]


def probed_verdicts() -> dict[str, tuple[bool, str]]:
    """The probe's verdicts so far, keyed by the text of what they depend on (op, params, operand types):
    a bundle keeps them, so a start from it needs no fake-tensor probe (whose import alone pulls in
    torch's compiler stack, seconds of a start). Keys whose text names an object's address are left out:
    they would not match in another process."""
    texts = ((repr(k), v) for k, v in _PROBED.items())
    return {text: v for text, v in texts if " at 0x" not in text}


def adopt_verdicts(verdicts: Mapping[str, Any]) -> None:
    """Takes verdicts of `probed_verdicts` (from a bundle compiled by the same dsgraph and torch, which
    its manifest checks) in place of probing the same keys again."""
    _ADOPTED.update({k: (bool(v[0]), str(v[1])) for k, v in verdicts.items()})


def _probe(step: LoweredStep) -> tuple[bool, str]:
    from torch._subclasses import fake_tensor
    from torch._subclasses.fake_tensor import FakeTensorMode

    # torch >= 2.13 names the mixed-device error; older versions raise a plain RuntimeError for it
    mismatch = getattr(fake_tensor, "FakeTensorDeviceMismatchError", _NoSuchError)

    eqn = step.eqn
    # fake CUDA tensors also catch a rule mixing devices; a build without CUDA can only fake the cpu
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with FakeTensorMode(allow_non_fake_inputs=False), unchecked():
        args = [
            torch.empty([int(d) for d in a.type.shape], dtype=to_torch(a.type.dtype), device=device)
            if isinstance(a, Var)
            else torch.full((), a.value, dtype=to_torch(a.type.dtype), device=device)
            for a in eqn.inputs
        ]
        try:
            step.rule(eqn.params, *args)
        except mismatch as exc:
            raise ExecutionError(f"{where(0, eqn)}: the rule mixes devices: {exc}") from exc
        except Exception as exc:  # noqa: BLE001  (any failure on fake tensors: run it eagerly)
            return False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    return True, "probed"


class StagedInputs:
    """Static device buffers for a step's inputs, packed per dtype into one device and one pinned host
    buffer: staging a step writes the host views and issues one copy per dtype."""

    def __init__(
        self, shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device
    ) -> None:
        self.shapes = dict(shapes)
        self.device = device
        pinned = device.type == "cuda"
        sizes: dict[torch.dtype, int] = {}
        for shape, dtype in self.shapes.values():
            sizes[dtype] = sizes.get(dtype, 0) + int(np.prod(shape, dtype=np.int64))
        self.host = {dt: torch.zeros(n, dtype=dt, pin_memory=pinned) for dt, n in sizes.items()}
        self.dev = {dt: torch.zeros(n, dtype=dt, device=device) for dt, n in sizes.items()}
        self.host_views: dict[str, np.ndarray] = {}  # numpy views of the host buffer: cheap writes
        self.tensors: dict[str, torch.Tensor] = {}
        offsets = dict.fromkeys(sizes, 0)
        for name, (shape, dtype) in self.shapes.items():
            n, at = int(np.prod(shape, dtype=np.int64)), offsets[dtype]
            self.host_views[name] = self.host[dtype][at : at + n].view(shape).numpy()
            self.tensors[name] = self.dev[dtype][at : at + n].view(shape)
            offsets[dtype] = at + n
        self.copied = torch.cuda.Event() if pinned else None

    def stage(self, values: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        missing = [n for n in self.shapes if n not in values]
        if missing or len(values) != len(self.shapes):
            raise ExecutionError(
                f"step inputs: missing {missing}, unexpected {sorted(set(values) - set(self.shapes))}"
            )
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy has read the host buffer
        for name, view in self.host_views.items():
            value = values[name]
            value = value.numpy(force=True) if isinstance(value, torch.Tensor) else np.asarray(value)
            if value.shape != view.shape:
                raise ExecutionError(
                    f"step input {name}: shape {list(value.shape)}, expected {list(view.shape)} (the bucket)"
                )
            np.copyto(view, value, casting="same_kind")
        for dtype, buffer in self.dev.items():
            buffer.copy_(self.host[dtype], non_blocking=True)
        if self.copied is not None:
            self.copied.record()


class Piece:
    """Consecutive capturable steps: a CUDA graph, or on a cpu device a re-run into the recorded buffers."""

    def __init__(self, program: DeviceProgram, steps: list[int], pool: Any) -> None:
        self.program, self.steps, self.pool = program, steps, pool
        self.graph = torch.cuda.CUDAGraph() if program.device.type == "cuda" else None
        self.static: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def record(self, env: dict[int, torch.Tensor]) -> None:
        ctx = torch.cuda.graph(self.graph, pool=self.pool) if self.graph is not None else nullcontext()
        try:
            with ctx, unchecked():
                for i in self.steps:
                    operands = self.program.args_of(i, env)
                    outs = self.program.run_step(i, env, check=False)
                    if self.graph is None:  # the cpu stand-in keeps every buffer of its steps
                        self.static.append((operands, outs))
                # the side stream (execute.py) rejoins inside the capture: a graph ends on its own stream
                self.program.join()
        except ExecutionError:
            raise
        except Exception as exc:  # the capture itself failed (a rule synced or touched host memory)
            ops = sorted({self.program.program.steps[i].eqn.op for i in self.steps})
            raise ExecutionError(
                f"capturing steps {self.steps[0]}..{self.steps[-1]} (ops {ops}) failed: "
                f"{type(exc).__name__}: {exc}; a rule that cannot run inside a CUDA graph should set "
                "`capturable = False`"
            ) from exc

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        with unchecked():
            for i, (operands, outs) in zip(self.steps, self.static, strict=True):
                _rerun(self.program, i, operands, outs)


class _Eager:
    """One step whose rule cannot be captured: run on the recorded buffers, results copied into them."""

    def __init__(self, program: DeviceProgram, i: int, env: dict[int, torch.Tensor]) -> None:
        self.program, self.i = program, i
        self.operands = program.args_of(i, env)
        self.outs = program.empty_outputs(i, env)
        eqn = program.program.steps[i].eqn
        for out, value in zip(eqn.outputs, self.outs, strict=True):
            env[out.id] = value
        for vid in program.dead[i]:
            env.pop(vid, None)

    def replay(self) -> None:
        _rerun(self.program, self.i, self.operands, self.outs)


def _rerun(program: DeviceProgram, i: int, operands: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    step = program.program.steps[i]
    results = write_back(call_rule(i, step.eqn, step.rule, operands), operands, program.inplace[i])
    for static, value in zip(outs, results, strict=True):
        if value is not static:
            static.copy_(value)


def _split(
    program: DeviceProgram, probe: Callable[[LoweredStep], tuple[bool, str]]
) -> list[tuple[bool, list[int]]]:
    """Runs of consecutive steps: (capturable, step indices)."""
    runs: list[tuple[bool, list[int]]] = []
    for i, step in enumerate(program.program.steps):
        ok = probe(step)[0]
        if runs and runs[-1][0] and ok:
            runs[-1][1].append(i)
        else:
            runs.append((ok, [i]))
    return runs


class CapturedStep:
    """One bucket's program captured (see the module doc). `fixed`: weights and caches by graph input
    name (persistent device tensors); `padding`: the step inputs of an all-padding step of this bucket."""

    def __init__(
        self,
        program: DeviceProgram,
        fixed: Mapping[str, torch.Tensor],
        padding: Mapping[str, torch.Tensor | np.ndarray],
        *,
        output: str = "logits",
        pool: Any = None,
        extra: Mapping[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
    ) -> None:
        graph = program.graph
        self.program, self.output = program, output
        shapes = {
            n: (tuple(int(d) for d in v.type.shape), to_torch(v.type.dtype))
            for v, n in zip(graph.inputs, graph.input_names, strict=True)
            if n not in fixed
        }
        # staged with the step in the same copy but not graph inputs (the overlapped-step input fix)
        self.extra = dict(extra or {})
        self.inputs = StagedInputs({**shapes, **self.extra}, program.device)
        self.runs = _split(program, capturable)
        self.inputs.stage(padding)
        args = {**fixed, **{k: v for k, v in self.inputs.tensors.items() if k not in self.extra}}
        self._warm_up(args)
        self.pool = (
            pool if pool is not None or program.device.type != "cuda" else torch.cuda.graph_pool_handle()
        )
        env = program.bind(args)
        self.phases: list[Piece | _Eager] = []
        for ok, steps in self.runs:
            if ok:
                piece = Piece(program, steps, self.pool)
                piece.record(env)
                self.phases.append(piece)
            else:
                self.phases.extend(_Eager(program, i, env) for i in steps)
        self.outputs = program.outputs(env)
        self.replays = 0

    def _warm_up(self, args: Mapping[str, torch.Tensor]) -> None:
        """Eager runs before recording, on a side stream as capture wants: one with the rules' checks, one
        without (the code path that is recorded), so lazy kernel compilation, library handles and the
        rules' constant tables are all set up. The padding step writes no cache entry."""
        device = self.program.device
        side = torch.cuda.Stream(device) if device.type == "cuda" else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side) if side is not None else nullcontext():
            self.program.run(args)
            with unchecked():
                self.program.run(args, check=False)
        if side is not None:
            torch.cuda.current_stream(device).wait_stream(side)
            # the warm-up's blocks are cached in the default pool, which the graph's pool cannot use
            torch.cuda.empty_cache()

    @property
    def num_graphs(self) -> int:
        return sum(isinstance(p, Piece) for p in self.phases)

    def replay(self, step: Mapping[str, torch.Tensor | np.ndarray]) -> torch.Tensor:
        """Stage `step` (the bucket's shapes), replay; returns the static `output` buffer (overwritten by
        the next replay). No host sync unless a piece runs eagerly."""
        self.inputs.stage(step)
        self.launch()
        return self.outputs[self.output]

    def launch(self) -> None:
        """Replay every piece on the staged inputs (host-sync free when every step was captured)."""
        for phase in self.phases:
            phase.replay()
        self.replays += 1

    @property
    def num_eager(self) -> int:
        return len(self.phases) - self.num_graphs

    def as_text(self) -> str:
        eqns: list[Eqn] = [s.eqn for s in self.program.program.steps]
        lines = [
            f"captured {self.program.graph.name}: {self.num_graphs} graphs, {self.num_eager} eager steps"
        ]
        for ok, steps in self.runs:
            if ok:
                lines.append(f"  graph: steps {steps[0]}..{steps[-1]} ({len(steps)})")
            else:
                lines += [
                    f"  eager: step {i} {eqns[i].op} ({capturable(self.program.program.steps[i])[1]})"
                    for i in steps
                ]
        return "\n".join(lines) + "\n"
