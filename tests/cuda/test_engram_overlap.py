"""The Engram side stream (platform/cuda/side_stream.py, execute.py): which equations are hoisted and
where the main stream waits, as a text dump; the hoisted program gives the same results as the program
order, eager and captured. The GPU-marked tests run the tiny model with its Engram tables in pinned host
memory, captured with the side stream, against the same model with the tables on the device and no
side stream: the logits must be equal bit for bit (same rules, same arithmetic, only streams differ)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from dsgraph.graph import TensorType, make_graph
from dsgraph.graph.passes import specialize
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING
from dsgraph.ops import core as C
from dsgraph.ops import engram as EG
from dsgraph.ops import shape as S
from dsgraph.platform.cuda import placement, target
from dsgraph.platform.cuda.execute import DeviceProgram
from dsgraph.platform.cuda.side_stream import SidePlan, plan_side_stream
from dsgraph.platform.registry import lower
from dsgraph.runtime.engine_config import CudaConfig
from dsgraph.runtime.session import Session
from tests.cuda.kernel_env import DEVICE, ON_GPU
from tests.oracle import model_fixtures as fx

I32, F32 = TensorType((3,), "i32"), TensorType((3, 32), "f32")


def _toy(step: Any, weights: Any, caches: Any) -> dict[str, Any]:
    """A cache-reading main path, and a host-table gather fed by step inputs through two equations."""
    main = C.add(caches["x"], weights["bias"])  # [0] reads a cache: main stream
    unrelated = C.mul(weights["bias"], weights["bias"])  # [1] pure but feeds no gather: main stream
    ids = C.cast(step["ids"], dtype="i64")  # [2] hoisted (an ancestor of the gather)
    rows = S.reshape(ids, shape=(3, 1))  # [3] hoisted
    table = weights["layers"]["1"]["engram"]["embed"]
    e = EG.gather_dequant_rows(table["weight"], table["scale"], rows, out_dtype="f32")  # [4] hoisted
    flat = S.reshape(e, shape=(3, 32))  # [5] main: waits on [4]
    return {"y": C.add(C.add(main, flat), unrelated), "rows": rows}  # [6], [7]


def _toy_graph() -> Any:
    table = {"weight": TensorType((10, 32), "f8e4m3"), "scale": TensorType((10, 1), "e8m0")}
    weights = {"bias": F32, "layers": {"1": {"engram": {"embed": table}}}}
    return make_graph(_toy, {"ids": I32}, weights, {"x": F32}, name="toy")


def test_the_plan_hoists_the_gather_and_its_step_only_ancestors() -> None:
    program = lower(_toy_graph(), "cuda")
    assert [s.eqn.op for s in program.steps] == ["add", "mul", "cast", "reshape", "gather_dequant_rows"] + [
        "reshape",
        "add",
        "add",
    ]
    plan = plan_side_stream(program)
    assert plan.as_text(program) == (
        "side stream of toy: 3 of 8 steps hoisted\n"
        "  side [2] cast\n"
        "  side [3] reshape\n"
        "  side [4] gather_dequant_rows\n"
        "  main [5] reshape waits on [4] gather_dequant_rows\n"
    )
    assert plan.order == (2, 3, 4, 0, 1, 5, 6, 7) and plan.signals == {4}
    # no host table among the inputs: nothing moves
    assert plan_side_stream(program, host=lambda _name: False) == SidePlan(tuple(range(8)), frozenset(), {})


def test_the_device_program_runs_the_hoisted_order_with_the_same_results() -> None:
    graph = _toy_graph()
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 0x7E, (10, 32), generator=gen, dtype=torch.uint8)
    args = {
        "step.ids": torch.tensor([3, 0, 9], dtype=torch.int32),
        "weights.bias": torch.randn(3, 32, generator=gen),
        "weights.layers.1.engram.embed.weight": codes.view(torch.float8_e4m3fn),
        "weights.layers.1.engram.embed.scale": torch.full((10, 1), 126, dtype=torch.uint8).view(
            torch.float8_e8m0fnu
        ),
        "caches.x": torch.randn(3, 32, generator=gen),
    }
    args = {k: v.to(DEVICE) for k, v in args.items()}
    hoisted = DeviceProgram(lower(graph, "cuda"), DEVICE)
    plain = DeviceProgram(lower(graph, "cuda"), DEVICE, side_stream=False)
    assert [s.eqn.op for s in hoisted.program.steps][:3] == ["cast", "reshape", "gather_dequant_rows"]
    assert hoisted.plan.waits == {5: (2,)} and plain.plan.side == frozenset()
    got, want = hoisted.run(args), plain.run(args)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    if ON_GPU:
        assert hoisted.streams.stream is not None and plain.streams.stream is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return fx.runner(
        fx.checkpoint("tiny", str(tmp_path_factory.mktemp("ckpt"))), REFERENCE if ON_GPU else SERVING
    )


def test_the_tiny_steps_hoist_both_engram_layers(tiny: Any) -> None:
    sizes = {**tiny.session.cache_sizes.sizes(), "tokens": 1, "seqs": 1, "outs": 1}
    program = lower(specialize(tiny.session.graph, sizes), "cuda")
    text = plan_side_stream(program).as_text(program)
    lines = text.splitlines()
    assert re.fullmatch(rf"side stream of v41_step\[.*\]: 4 of {len(program.steps)} steps hoisted", lines[0])
    side = [re.fullmatch(r"  side \[(\d+)\] (\w+)", line) for line in lines[1:5]]
    assert [m[2] for m in side if m] == ["engram_hash", "gather_dequant_rows"] * 2, text
    waits = [
        re.fullmatch(r"  main \[(\d+)\] reshape waits on \[(\d+)\] gather_dequant_rows", x) for x in lines[5:]
    ]
    assert len(waits) == 2 and all(waits), text
    gathers = [int(m[1]) for m in side if m and m[2] == "gather_dequant_rows"]
    assert [int(m[2]) for m in waits if m] == gathers
    # each wait sits right after its gather in program order, well after the step's first layer
    assert [int(m[1]) for m in waits if m] == [g + 1 for g in gathers] and gathers[0] > 10


def _sessions(runner: Any, cuda: CudaConfig) -> Session:
    weights = {k.removeprefix("weights."): v for k, v in runner.session.weights.items()}
    return Session(
        runner.model,
        weights,
        runner.session.cache_sizes,
        # off the GPU the default rules (cpu rules on the device path), as tests/cuda/test_platform.py does
        platform="cuda" if ON_GPU else target.DEFAULTS,
        device=DEVICE,
        cuda=cuda,
    )


def _run(session: Session, runner: Any) -> list[torch.Tensor]:
    chunks = [[(0, fx.prompt(1, 21)), (1, fx.prompt(2, 3))], [(0, [7]), (1, [9])], [(0, [11]), (1, [13])]]
    out = []
    for chunk in chunks:
        inputs = runner.step_inputs(chunk)
        runner.step(chunk)  # advances the runner's sequences (the cpu platform's result is not used)
        out.append(session.run(inputs).float().cpu().clone())
    return out


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_side_stream_and_host_tables_give_the_logits_of_the_plain_program(
    tmp_path: Path, capture: bool
) -> None:
    """On a GPU: pinned host tables, the side stream and its events (captured: inside the CUDA graphs);
    on the CPU the same plan and order without streams."""
    runner = fx.runner(fx.checkpoint("tiny", str(tmp_path)), REFERENCE if ON_GPU else SERVING)
    runner.add(0)
    runner.add(1)
    overlapped = _sessions(runner, CudaConfig(capture=capture, engram_host_min_bytes=0, side_stream=True))
    if ON_GPU:
        hosted = [k for k, v in overlapped.weights.items() if placement.host_of(v) is not None]
        assert len(hosted) == 4, hosted  # two layers' tables and scales
    got = _run(overlapped, runner)
    assert all(p.plan.side for p in overlapped.runner.programs.values())  # the gathers were hoisted
    runner2 = fx.runner(fx.checkpoint("tiny", str(tmp_path / "b")), REFERENCE if ON_GPU else SERVING)
    runner2.add(0)
    runner2.add(1)
    # one stream in program order, every table on the device: EngineConfig.cuda reaches the runner
    plain = _sessions(runner2, CudaConfig(capture=capture, engram_host_min_bytes=1 << 62, side_stream=False))
    want = _run(plain, runner2)
    assert plain.runner.programs and all(not p.plan.side for p in plain.runner.programs.values())
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {k}: logits differ by {float((g - w).abs().max())}"
