"""The cuda platform: every op of the tiny V4.1 prefill and decode graphs lowers on it; in-place cache
writes are ordered after the readers of the old cache (or lowering fails naming the equations); kernel
modules that fail to import fall back visibly; and the platform's default rules (the cpu rules on
device tensors, cache writes in place), run eagerly or through the captured-step machinery, give the cpu
platform's results. Without CUDA everything runs on the CPU (captured pieces re-run their steps there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dsgraph.graph import TensorType, make_graph
from dsgraph.graph.passes import specialize
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING
from dsgraph.ops import core as C
from dsgraph.ops import shape as S
from dsgraph.platform.cpu.target import PLATFORM as CPU
from dsgraph.platform.cuda import target
from dsgraph.platform.cuda.capture import StagedInputs, capturable
from dsgraph.platform.cuda.execute import DeviceProgram
from dsgraph.platform.fusion import fuse
from dsgraph.platform.inplace import check_inplace
from dsgraph.platform.registry import PLATFORM_NAMES, LoweringError, Platform, get_platform, lower
from dsgraph.runtime.engine_config import CudaConfig
from dsgraph.runtime.session import Session
from dsgraph.runtime.step_padding import bucket_size, pad_step
from tests.cuda.kernel_env import DEVICE, ON_GPU, assert_matches
from tests.oracle import model_fixtures as fx

# On a GPU the cpu rules sum in another order; the serving numerics of the tiny model would amplify that
# (see tests/cuda/test_e2e_gpu.py), so the GPU run uses the reference numerics and this bound.
GPU_LOGITS_REL_TOL = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.runner(fx.checkpoint("tiny", str(tmp_path_factory.mktemp("ckpt"))), SERVING)


def _sizes(runner, tokens: int, seqs: int, outs: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {**runner.session.cache_sizes.sizes(), "tokens": tokens, "seqs": seqs, "outs": outs}


def test_cuda_is_a_platform_with_a_rule_for_every_op_the_cpu_has() -> None:
    assert "cuda" in PLATFORM_NAMES
    cuda = get_platform("cuda")
    assert cuda.name == "cuda" and set(CPU.rules) <= set(cuda.rules)
    assert set(target.DEFAULTS.rules) == set(CPU.rules)
    for op in ("swa_write", "paged_write", "compress"):  # the defaults write caches in place
        assert target.DEFAULTS.rules[op].__name__ == f"{op}_into"


@pytest.mark.parametrize("shape", [(16, 2, 2), (1, 1, 1)], ids=["prefill", "decode"])
def test_every_op_of_the_tiny_graphs_lowers_on_cuda(tiny, shape: tuple[int, int, int]) -> None:  # type: ignore[no-untyped-def]
    graph = specialize(tiny.session.graph, _sizes(tiny, *shape))
    program = lower(graph, "cuda")
    # lowering merges the pairs that have a fused op (platform/fusion.py, ops/fused.py)
    fused = fuse(graph)
    assert {s.eqn.op for s in program.steps} == {e.op for e in fused.eqns}
    assert len(program.steps) == len(fused.eqns) < len(graph.eqns)
    want = {
        "rms_norm_qdq",
        "rope_qdq",
        "swiglu_qdq",
        "hc_expand_pre",
        "hc_collapse_norm_qdq",
        "encode_swa_write",
    }
    assert want <= {e.op for e in fused.eqns}
    check_inplace(program.graph, get_platform("cuda"))
    # the ring write of each layer now follows the attention that reads the old ring
    order = [s.eqn.op for s in program.steps]
    assert order.index("encode_swa_write") > order.index("attention")
    assert "program v41_step" in program.as_text()


def test_inplace_writes_move_after_the_readers_of_the_old_value() -> None:
    plat = Platform("test", CPU.rules, inplace={"add": lambda _e: ((0, 0),)})
    t = TensorType((4,), "f32")
    graph = make_graph(lambda x, b, c: {"y": C.add(x, b), "z": C.mul(x, c)}, t, t, t)
    assert [e.op for e in graph.eqns] == ["add", "mul"]
    program = lower(graph, plat)
    assert [s.eqn.op for s in program.steps] == ["mul", "add"]
    x, b, c = (torch.arange(4.0) + k for k in range(3))
    out = DeviceProgram(program, "cpu").run(_named(graph, x, b, c))
    assert torch.equal(out["y"], x + b) and torch.equal(out["z"], x * c)


def _named(graph, *values: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return {n: v.clone() for n, v in zip(graph.input_names, values, strict=True)}


def test_a_reader_of_the_old_value_that_needs_the_write_fails_lowering() -> None:
    plat = Platform("test", CPU.rules, inplace={"add": lambda _e: ((0, 0),)})
    t = TensorType((4,), "f32")
    graph = make_graph(lambda x, b: {"z": C.mul(x, C.add(x, b))}, t, t)
    with pytest.raises(LoweringError, match=r"eqn 0 `.*add.*overwrites an operand in place.*eqn 1 `.*mul"):
        lower(graph, plat)
    returned = make_graph(lambda x, b: {"x": x, "y": C.add(x, b)}, t, t)
    with pytest.raises(LoweringError, match="also graph output 'x'"):
        lower(returned, plat)


def test_an_in_place_rule_returning_a_new_tensor_is_copied_into_its_operand() -> None:
    plat = Platform("test", CPU.rules, inplace={"add": lambda _e: ((0, 0),)})
    t = TensorType((4,), "f32")
    graph = make_graph(lambda x, b: {"y": C.add(x, b)}, t, t)
    args = _named(graph, torch.ones(4), torch.full((4,), 2.0))
    buffer = args[graph.input_names[0]]
    out = DeviceProgram(lower(graph, plat), "cpu").run(args)
    assert out["y"] is buffer and torch.equal(buffer, torch.full((4,), 3.0))


def test_a_kernel_module_that_fails_to_import_falls_back_and_is_shown(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pkg = tmp_path / "fake_kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text('import not_a_module_h5a\nRULES = {"add": None, "mul": None}\n')
    (pkg / "good.py").write_text(
        "from dsgraph.platform.cpu.rules_core import RULES as R\nRULES = {'sub': R['sub']}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_kernels", raising=False)
    rules, fallbacks, errors = target.kernel_rules("fake_kernels")
    assert set(rules) == {"sub"} and set(fallbacks) == {"add", "mul"}
    assert "not_a_module_h5a" in errors["broken"] and "kernels.broken did not import" in fallbacks["add"]
    plat = Platform("cuda", CPU.rules, fallbacks=fallbacks)
    t = TensorType((4,), "f32")
    text = lower(make_graph(lambda x: {"y": C.add(x, x)}, t), plat).as_text()
    assert "(fallback: kernels.broken did not import" in text and "fallback add:" in text
    assert "mul" not in text  # only the ops the program uses


def test_capturable_probes_the_cpu_rules(tiny) -> None:  # type: ignore[no-untyped-def]
    program = lower(specialize(tiny.session.graph, _sizes(tiny, 4, 1, 1)), target.DEFAULTS)
    verdict = {s.eqn.op: capturable(s)[0] for s in program.steps}
    assert not verdict["moe_experts"]  # data-dependent shapes (nonzero)
    # the cache writes and attention (its selected compressed entries gathered without nonzero) have a
    # host-free path when unchecked
    assert verdict["swa_write"] and verdict["paged_write"] and verdict["compress"] and verdict["attention"]
    assert verdict["rms_norm"] and verdict["hc_expand"]


def test_staged_inputs_pack_per_dtype_and_name_a_wrong_shape() -> None:
    staged = StagedInputs(
        {"a": ((2, 3), torch.int32), "b": ((4,), torch.int32), "c": ((2,), torch.float32)}, DEVICE
    )
    assert {dt: buf.numel() for dt, buf in staged.dev.items()} == {torch.int32: 10, torch.float32: 2}
    staged.stage(
        {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": torch.tensor([7, 8, 9, 10]), "c": [0.5, 1.5]}
    )
    assert staged.tensors["a"].cpu().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert staged.tensors["b"].cpu().tolist() == [7, 8, 9, 10] and staged.tensors["c"].cpu().tolist() == [
        0.5,
        1.5,
    ]
    with pytest.raises(Exception, match=r"step input b: shape \[3\], expected \[4\]"):
        staged.stage(
            {"a": np.zeros((2, 3), np.int32), "b": np.zeros(3, np.int32), "c": np.zeros(2, np.float32)}
        )


def test_padding_rounds_every_step_dim_to_a_power_of_two() -> None:
    assert [bucket_size(n) for n in (0, 1, 2, 3, 5, 8, 9)] == [1, 1, 2, 4, 8, 8, 16]
    step = {"seq_ids": np.array([0, 0, 1], np.int32), "lookback": np.array([[4, 5]], np.int32)}
    padded = pad_step(step, {"seq_ids": "tokens", "lookback": "seqs"}, {"tokens": 4, "seqs": 2})
    assert padded["seq_ids"].tolist() == [0, 0, 1, -1] and padded["lookback"].tolist() == [[4, 5], [-1, -1]]
    with pytest.raises(ValueError, match="step input seq_ids: 3 tokens, more than the bucket's 2"):
        pad_step(step, {"seq_ids": "tokens", "lookback": "seqs"}, {"tokens": 2, "seqs": 2})


def _device_session(runner, capture: bool) -> Session:  # type: ignore[no-untyped-def]
    weights = {k.removeprefix("weights."): v for k, v in runner.session.weights.items()}
    return Session(
        runner.model,
        weights,
        runner.session.cache_sizes,
        platform=target.DEFAULTS,
        device=DEVICE,
        cuda=CudaConfig(capture=capture),
    )


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "captured"])
def test_default_rules_on_the_device_give_the_cpu_results(tmp_path: Path, capture: bool) -> None:
    runner = fx.runner(fx.checkpoint("tiny", str(tmp_path)), REFERENCE if ON_GPU else SERVING)
    device = _device_session(runner, capture)
    runner.add(0)
    runner.add(1)
    # a prompt longer than the SWA ring: its first rows are not written to the ring
    chunks = [[(0, fx.prompt(1, 21)), (1, fx.prompt(2, 3))], [(0, [7]), (1, [9])], [(0, [11]), (1, [13])]]
    for chunk in chunks:
        inputs = runner.step_inputs(chunk)
        want = runner.step(chunk)
        got = device.run(inputs)
        if ON_GPU:
            assert fx.rel_err(got.float().cpu(), torch.cat(want).float()) <= GPU_LOGITS_REL_TOL
        else:
            assert_matches(got, torch.cat(want), "logits", (0.0, 0.0))
    if not ON_GPU:  # on the GPU a flipped rounding changes encoded cache bytes: the logits are the check
        for name, cache in runner.caches.items():
            assert_matches(device.caches[name], cache, f"cache {name}", (0.0, 0.0))
    assert device.captures == (2 if capture else 0)  # the two decode steps share a bucket


def _ring_by_hand(ring: torch.Tensor, entries, positions, seq_ids, seq_slot, seq_end) -> torch.Tensor:  # type: ignore[no-untyped-def]
    out, ring_len = ring.clone(), ring.shape[1]
    for t, (pos, s) in enumerate(zip(positions.tolist(), seq_ids.tolist(), strict=True)):
        if s >= 0 and pos >= int(seq_end[s]) - ring_len:
            out[int(seq_slot[s]), pos % ring_len] = entries[t]
    return out


def _pool_by_hand(pool: torch.Tensor, values, entry_ids, valid, rows, table) -> torch.Tensor:  # type: ignore[no-untyped-def]
    out, block_size = pool.clone(), pool.shape[1]
    for t, (e, ok, s) in enumerate(zip(entry_ids.tolist(), valid.tolist(), rows.tolist(), strict=True)):
        if ok and s >= 0 and 0 <= e < table.shape[1] * block_size and int(table[s, e // block_size]) >= 0:
            out[int(table[s, e // block_size]), e % block_size] = values[t]
    return out


def test_unchecked_cache_writes_equal_the_checked_ones() -> None:
    """swa_write and paged_write, checked and unchecked (capturable), write exactly the rows a by-hand
    loop writes: rows past the ring, padding rows and invalid entries write nothing."""
    from dsgraph.platform.cpu.rules_cache import paged_write, paged_write_into, swa_write, swa_write_into
    from dsgraph.platform.cpu.step_rows import unchecked

    gen = torch.Generator().manual_seed(5)
    ring = torch.randint(0, 256, (3, 5, 4), dtype=torch.uint8, generator=gen)
    positions = torch.tensor([*range(10, 18), 3, 4, 0, 0], dtype=torch.int32)
    seq_ids = torch.tensor([0] * 8 + [1, 1, -1, -1], dtype=torch.int32)
    entries = torch.randint(0, 256, (12, 4), dtype=torch.uint8, generator=gen)
    swa_args = (
        entries,
        positions,
        seq_ids,
        torch.tensor([2, 0], dtype=torch.int32),
        torch.tensor([18, 5]).int(),
    )
    want = _ring_by_hand(ring, *swa_args)
    assert torch.equal(swa_write(None, ring, *swa_args), want)
    with unchecked():
        got = swa_write_into(None, ring.clone(), *swa_args)
    assert torch.equal(got, want) and not torch.equal(want, ring)

    pool = torch.randint(0, 256, (4, 2, 3), dtype=torch.uint8, generator=gen)
    table = torch.tensor([[3, 1, -1], [0, -1, -1]], dtype=torch.int32)
    entry_ids = torch.tensor([0, 1, 2, 3, 0, 1, -1, 5], dtype=torch.int32)
    valid = torch.tensor([1, 0, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    rows = torch.tensor([0, 0, 0, 0, 1, 1, 1, -1], dtype=torch.int32)
    values = torch.randint(0, 256, (8, 3), dtype=torch.uint8, generator=gen)
    want = _pool_by_hand(pool, values, entry_ids, valid, rows, table)
    assert torch.equal(paged_write(None, pool, values, entry_ids, valid, rows, table), want)
    with unchecked():
        got = paged_write_into(None, pool.clone(), values, entry_ids, valid, rows, table)
        nothing = paged_write_into(None, pool.clone(), values, entry_ids, valid & False, rows, table)
    assert torch.equal(got, want) and not torch.equal(want, pool) and torch.equal(nothing, pool)


def test_an_overwritten_value_read_through_a_view_op_fails_lowering() -> None:
    plat = Platform("test", CPU.rules, inplace={"add": lambda _e: ((0, 0),)})
    t = TensorType((4,), "f32")
    graph = make_graph(lambda x, b: {"v": S.reshape(x, shape=(2, 2)), "y": C.add(x, b)}, t, t)
    with pytest.raises(LoweringError, match=r"operand 0 .* overwritten in place .*reshape.* may hold a view"):
        lower(graph, plat)


def test_kernel_env_compares_a_cuda_rule_with_the_cpu_rule() -> None:
    from dsgraph.platform.cpu.rules_core import RULES as CORE
    from tests.cuda.kernel_env import compare_rules, tolerance

    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    got, want = compare_rules("rms_norm", _RmsParams(), [x, torch.ones(8)], cuda_rule=CORE["rms_norm"])
    assert got[0].device.type == DEVICE.type and torch.allclose(got[0].cpu(), want[0], rtol=1e-6, atol=1e-6)
    off_by_one = lambda p, a, w: CORE["rms_norm"](p, a, w) * 1.01  # noqa: E731
    with pytest.raises(AssertionError, match="rms_norm result 0"):
        compare_rules("rms_norm", _RmsParams(), [x, torch.ones(8)], cuda_rule=off_by_one)
    assert tolerance(torch.int32) == (0.0, 0.0) and tolerance(torch.bfloat16)[0] > tolerance(torch.float32)[0]


class _RmsParams:
    eps = 1e-6
