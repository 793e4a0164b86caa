"""What one step of the cuda platform launches, counted on a machine without a GPU: per op, per layer
and per kernel, for any configuration (the bench model's full width included) in about a minute.

The step runs through the cuda platform's own rules, on meta tensors (shapes and dtypes, no memory),
equation by equation, with value checks off (as in a captured step). Triton's interpreter is on, so the
rules take their kernel path for non-CUDA tensors; each launch is recorded and not run (a meta tensor
has no values to compute with). torch operations the rules call are recorded through a dispatch mode,
except those that only make a view or an allocation. Triton launches are exact; a torch operation counts
as one kernel, which torch's sorts and top-k (several kernels each) undercount. The captured-kernel
profile of `dsgraph bench` on a GPU is the measurement; this is the count a change can be checked
against before a GPU is at hand (issue 16's kernels per decode layer).

Must run in a process where triton has not been imported yet (TRITON_INTERPRET is read at import):
`dsgraph inspect --kernels` starts `python -m dsgraph.tools.kernel_census` for that reason.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsgraph.platform import env as dsgraph_env

# torch operations that launch no kernel: views, reshapes and allocations (a captured graph replays no
# allocation; torch.zeros still counts: it is a fill kernel)
NO_KERNEL = frozenset(
    "view _unsafe_view reshape _reshape_alias as_strided expand slice select t transpose permute unsqueeze "
    "squeeze detach alias empty empty_strided empty_like new_empty new_empty_strided lift_fresh split "
    "split_with_sizes unbind narrow unflatten flatten view_as".split()
)
_LAYER = re.compile(r"weights\.(layers|mtp)\.(\d+)\.")  # a decoder layer, or a draft stage ("mtp1")
_HEAD = ("weights.norm.", "weights.head.")
HEAD, EMBED = "head", "embed"
# equations that read only the step's inputs (and literals), directly or through each other: computed once
# per step for every layer (a replay mask, entry ids), so no layer's
STEP = "step"
# decode and prefill steps; the DSpark draft pass through its full graph or its greedy variant
STEPS = ("decode", "prefill", "draft", "draft_greedy")


@dataclass
class Census:
    """Launches of one step: per equation's op, per layer (by the layer weights the equation reads)."""

    program: str
    layers: int
    per_op: dict[str, Counter] = field(default_factory=dict)  # op -> Counter of "triton:k" / "torch:op"
    op_counts: Counter = field(default_factory=Counter)  # op -> equations
    per_layer: Counter = field(default_factory=Counter)  # layer index (str) / embed / head -> launches
    per_layer_op: dict[str, Counter] = field(default_factory=dict)  # layer -> op -> launches

    @property
    def total(self) -> int:
        return sum(self.per_layer.values())

    def layer_mean(self) -> float:
        """Launches per decoder layer, or per stage of a draft pass (embedding and head excluded)."""
        inner = sum(v for k, v in self.per_layer.items() if k not in (EMBED, HEAD, STEP))
        return inner / max(self.layers, 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "launches": self.total,
            "layers": self.layers,
            "per_layer_mean": self.layer_mean(),
            "per_layer": dict(self.per_layer),
            "per_layer_op": {k: dict(c.most_common()) for k, c in self.per_layer_op.items()},
            "per_op": {
                op: {"equations": self.op_counts[op], "launches": sum(c.values()), "kernels": dict(c)}
                for op, c in sorted(self.per_op.items(), key=lambda kv: -sum(kv[1].values()))
            },
        }

    def as_text(self, by_layer: bool = False) -> str:
        lines = [
            f"{self.program}: {self.total} launches, {self.layer_mean():.1f} per decoder layer "
            f"({self.layers} layers; Triton launches exact, a torch op counted as one kernel)",
            "  per layer: " + ", ".join(f"{k}={v}" for k, v in self.per_layer.items()),
        ]
        for op, row in self.as_dict()["per_op"].items():
            kernels = ", ".join(f"{k} x{n}" for k, n in sorted(row["kernels"].items(), key=lambda kv: -kv[1]))
            lines.append(f"  {op:<20} {row['equations']:>4} eqns {row['launches']:>5} launches  {kernels}")
        if by_layer:
            for layer, ops in self.per_layer_op.items():
                counts = ", ".join(f"{op} {n}" for op, n in ops.most_common())
                lines.append(f"  layer {layer} ({self.per_layer[layer]}): {counts}")
        return "\n".join(lines) + "\n"


class _Recorder:
    def __init__(self) -> None:
        self.launches: list[str] = []


@contextmanager
def _recording(rec: _Recorder) -> Iterator[None]:
    """Triton launches recorded instead of run; torch operations recorded as they run (on meta)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import InterpretedFunction

    import dsgraph.platform.cuda.scale_bound as scale_bound

    class _Torch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            name = func.overloadpacket.__name__
            if name not in NO_KERNEL:
                rec.launches.append(f"torch:{name}")
            return func(*args, **(kwargs or {}))

    def launch(self: Any, *args: Any, grid: Any = None, **kwargs: Any) -> None:
        rec.launches.append(f"triton:{self.fn.__name__}")

    saved_run, saved_bound = InterpretedFunction.run, scale_bound._bound
    InterpretedFunction.run = launch
    # a meta tensor has no bytes to bound: take the trained-checkpoint case (the same launch count)
    scale_bound._bound = lambda t: True
    try:
        with _Torch():
            yield
    finally:
        InterpretedFunction.run, scale_bound._bound = saved_run, saved_bound


def _layer_of(names: list[str], current: str) -> str:
    for n in names:
        m = _LAYER.match(n)
        if m:
            return m[2] if m[1] == "layers" else f"mtp{m[2]}"
        if n.startswith(_HEAD):
            return HEAD
    return current


def count_program(program: Any, args: Mapping[str, Any], layers: int) -> Census:
    """Run a bound DeviceProgram equation by equation under the recorder."""
    from dsgraph.graph.ir import Var
    from dsgraph.platform.cpu.step_rows import unchecked

    graph = program.program.graph
    names = {v.id: n for v, n in zip(graph.inputs, graph.input_names, strict=True)}
    step_level = {v.id for v, n in zip(graph.inputs, graph.input_names, strict=True) if n.startswith("step.")}
    census = Census(graph.name, layers)
    rec = _Recorder()
    where = EMBED
    with unchecked(), _recording(rec):
        env = program.bind(args)
        for i, step in enumerate(program.program.steps):
            eqn = step.eqn
            read = [names[a.id] for a in eqn.inputs if isinstance(a, Var) and a.id in names]
            where = _layer_of(read, where)
            per_step = all(a.id in step_level for a in eqn.inputs if isinstance(a, Var))
            if per_step:
                step_level.update(v.id for v in eqn.outputs)
            start = len(rec.launches)
            program.run_step(i, env, check=False)
            got = Counter(rec.launches[start:])
            census.op_counts[eqn.op] += 1
            if got:
                bucket = STEP if per_step else where
                census.per_op.setdefault(eqn.op, Counter()).update(got)
                census.per_layer[bucket] += sum(got.values())
                census.per_layer_op.setdefault(bucket, Counter())[eqn.op] += sum(got.values())
    return census


def _meta_session(cfg: Any, seqs: int, length: int, weights: Any, dspark: bool = False) -> Any:
    """A cuda session on the meta device for `seqs` requests of `length` tokens."""
    if not dsgraph_env.triton_interpreting():
        raise RuntimeError("kernel census: run with TRITON_INTERPRET=1 set before triton is imported")
    from dsgraph.models.deepseek_v41.step_io import ratios
    from dsgraph.runtime.engine_config import CudaConfig
    from dsgraph.runtime.session import CacheSizes, Session
    from dsgraph.tools.bench.model_bench import make_model, pages_for

    model = make_model(cfg, length + 64, dspark=dspark)
    pages = {r: seqs * pages_for(model, r, length) for r in ratios(model.plans)}
    # everything "on the device" (no pinned host table), one stream, eager: the captured step's launches
    cuda = CudaConfig(capture=False, side_stream=False, engram_host_min_bytes=1 << 62)
    return Session(model, weights, CacheSizes(seqs, pages), platform="cuda", device="meta", cuda=cuda)


def census(cfg: Any, step: str, batch: int, context: int) -> Census:
    """The launches of one `step` (decode: `batch` requests at `context`; prefill: one chunk of `batch`
    tokens) of the V4.1 model `cfg` on the cuda platform."""
    from dsgraph.models.deepseek_v41.dummy_weights import meta_serving_weights
    from dsgraph.tools.bench.steps import decode_step, prefill_step

    seqs, length = (batch, context) if step == "decode" else (1, batch)
    session = _meta_session(cfg, seqs, length, meta_serving_weights(cfg))
    model = session.model
    inputs = decode_step(model, batch, context) if step == "decode" else prefill_step(model, batch)
    program, args = session.bound_program(inputs)
    _warm_up(program, args)
    return count_program(program, args, cfg.text.num_hidden_layers)


def draft_census(cfg: Any, batch: int, context: int, greedy: bool) -> Census:
    """The launches of one DSpark draft pass for `batch` requests at `context` (the greedy variant, or the
    full graph that samples and returns log-probabilities)."""
    import torch

    from dsgraph.models.deepseek_v41.dspark_io import DraftRequest
    from dsgraph.models.deepseek_v41.dummy_weights import meta_serving_weights
    from dsgraph.platform.cuda.execute import DeviceProgram
    from dsgraph.runtime.spec_draft import DraftRunner
    from dsgraph.runtime.step_padding import bucket_size

    weights = meta_serving_weights(cfg, dspark=True)
    session = _meta_session(cfg, batch, context, weights, dspark=True)
    runner = DraftRunner(session, weights)
    seqs = bucket_size(batch)
    requests = [DraftRequest(anchor=1, position=context - 1, slot=b) for b in range(batch)]
    step = session.model.draft_inputs(requests, seqs)
    program = DeviceProgram(runner._program(seqs, greedy), "meta", side_stream=False)
    args = {**runner._fixed(), **{f"step.{k}": torch.as_tensor(v).to("meta") for k, v in step.items()}}
    _warm_up(program, args)
    return count_program(program, args, cfg.text.num_nextn_predict_layers)


def _warm_up(program: Any, args: Mapping[str, Any]) -> None:
    """One uncounted run first: rules that prepare a weight once (and keep it) do it here, as a GPU
    session's warm-up does before its capture."""
    from dsgraph.platform.cpu.step_rows import unchecked

    with unchecked(), _recording(_Recorder()):
        program.run(args, check=False)


def _config(model: str | None) -> Any:
    if model is None:
        from dsgraph.tools.bench.model_config import bench_config

        return bench_config()
    from dsgraph.models.deepseek_v41.config import load_config

    return load_config(Path(model))


def main(argv: list[str] | None = None) -> int:
    prog = "python -m dsgraph.tools.kernel_census"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="model directory (config.json); default: the bench model (8 layers)")
    ap.add_argument("--step", choices=STEPS, default="decode")
    ap.add_argument("--batch", type=int, default=1, help="decode, draft: requests; prefill: chunk tokens")
    ap.add_argument("--context", type=int, default=8192, help="decode, draft: context length")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--by-layer", action="store_true", help="also each layer's launches per op")
    args = ap.parse_args(argv)
    cfg = _config(args.model)
    if args.step in ("draft", "draft_greedy"):
        result = draft_census(cfg, args.batch, args.context, args.step == "draft_greedy")
    else:
        result = census(cfg, args.step, args.batch, args.context)
    print(json.dumps(result.as_dict(), indent=1) if args.json else result.as_text(args.by_layer), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
