"""The tiny V4.1 model end to end on the GPU on the full cuda platform (Triton kernels where they exist)
against the cpu platform.

Why two numerics: in serving numerics the tiny random model is chaotic. Activations are rounded to bf16
and FP8 at every layer, and one bf16 ulp of difference in 5% of one op's outputs (the attention kernel's
online softmax vs the cpu rule's, for instance) moves the prefill logits by ~50% relative (measured on
the cpu platform). So serving numerics are checked op by op, teacher-forced: every equation's cuda rule on
the GPU gets the cpu platform's inputs and must match the cpu rule (prefill and 32 decode steps). The
free-running comparison (logits within tolerance, the same greedy tokens over 32 decode steps) uses the
reference numerics (f32 activations), where such differences stay at their own size. Both runs check
that the captured replay equals an eager run bit for bit and that a repeated bucket is not recaptured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dsgraph.graph.ir import Lit
from dsgraph.graph.passes import specialize
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING, Numerics
from dsgraph.platform.cpu.interpret import literal
from dsgraph.platform.cpu.target import PLATFORM as CPU
from dsgraph.platform.registry import lower
from dsgraph.runtime.engine_config import CudaConfig
from dsgraph.runtime.session import Session
from tests.cuda import bounds
from tests.oracle import model_fixtures as fx

pytestmark = pytest.mark.gpu

# free-running reference numerics: logits relative to the largest |logit| (f32 everywhere; kernels sum in
# another order, and NVFP4 cache encodings may flip on a few entries)
REFERENCE_LOGITS_REL_TOL = 1e-3
DECODE_STEPS = 32
# teacher-forced ops: max |cuda - cpu| <= ULPS * ulp(dtype) * max |cpu| (norm-wise: accumulation order)
ULPS = 4
ULP = {torch.float32: 2.0**-23 * 64, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # f32: long sums
# integer results computed from scores inside the op (a near tie may order differently): allowed share
SELECTION_MISMATCH = {"moe_route": 0.01}


def _sessions(runner) -> tuple[Session, Session]:  # type: ignore[no-untyped-def]
    weights = {k.removeprefix("weights."): v for k, v in runner.session.weights.items()}
    sizes = runner.session.cache_sizes
    captured = Session(runner.model, weights, sizes, platform="cuda", device="cuda")
    eager = Session(
        runner.model, weights, sizes, platform="cuda", device="cuda", cuda=CudaConfig(capture=False)
    )
    return captured, eager


def _steps(runner, decode_steps: int):  # type: ignore[no-untyped-def]
    """Prefill two requests, then `decode_steps` greedy decodes driven by the cpu platform's logits:
    yields (step index, inputs, cpu logits, the cpu caches before the step)."""
    prompts = {0: fx.prompt(1, 21), 1: fx.prompt(2, 9)}
    for rid in prompts:
        runner.add(rid)
    chunks = [(rid, p) for rid, p in prompts.items()]
    for step in range(decode_steps + 1):
        inputs = runner.step_inputs(chunks)
        before = {k: v.clone() for k, v in runner.caches.items()}
        want = torch.cat(runner.step(chunks))
        yield step, inputs, want, before
        ends = torch.tensor([len(c[1]) for c in chunks]).cumsum(0) - 1
        chunks = [(rid, [int(want[int(e)].argmax())]) for (rid, _), e in zip(chunks, ends, strict=True)]


def _runner(tmp_path: Path, num: Numerics):  # type: ignore[no-untyped-def]
    return fx.runner(fx.checkpoint("tiny", str(tmp_path)), num)


def test_reference_numerics_free_running_matches_cpu(tmp_path: Path) -> None:
    runner = _runner(tmp_path, REFERENCE)
    captured, eager = _sessions(runner)
    for step, inputs, want, _ in _steps(runner, DECODE_STEPS):
        got = captured.run(inputs).clone()
        assert torch.equal(got, eager.run(inputs)), f"step {step}: captured replay differs from the eager run"
        err = fx.rel_err(got.float().cpu(), want.float())
        assert err <= REFERENCE_LOGITS_REL_TOL, f"step {step}: logits relative error {err:.3g}"
        if step:  # the GPU's greedy tokens are the cpu platform's (which drive the next step)
            assert torch.equal(got.float().argmax(-1).cpu(), want.argmax(-1)), f"decode step {step}: tokens"
        if step == 1:
            captures = captured.captures
    assert captured.captures == captures == 2 and eager.captures == 0  # prefill bucket, decode bucket
    for name, cache in captured.caches.items():
        assert torch.equal(cache, eager.caches[name]), f"cache {name}: captured and eager runs differ"


def test_serving_numerics_every_op_matches_cpu_teacher_forced(tmp_path: Path) -> None:
    runner = _runner(tmp_path, SERVING)
    captured, eager = _sessions(runner)
    for step, inputs, _, before in _steps(runner, DECODE_STEPS):
        if step in (0, 1, DECODE_STEPS):  # the prefill bucket, the decode bucket, and once more at the end
            teacher_forced(runner.session, inputs, before)
        got = captured.run(inputs).clone()
        assert torch.equal(got, eager.run(inputs)), f"step {step}: captured replay differs from the eager run"
        if step == 1:
            captures = captured.captures
    assert captured.captures == captures == 2


def teacher_forced(
    session: Session, inputs: dict[str, torch.Tensor], caches: dict[str, torch.Tensor], device: str = "cuda"
) -> None:
    """Every equation of the step, in the cuda program's order: the cuda rule on `device` and the cpu rule
    on the CPU get the same inputs (the cpu platform's values, from `caches` before the step), and their
    results must match. `session` is the cpu platform's."""
    sizes = {
        **session.cache_sizes.sizes(),
        "tokens": len(inputs["token_ids"]),
        "seqs": len(inputs["seq_slot"]),
    }
    sizes["outs"] = len(inputs["sample_rows"])
    program = lower(specialize(session.graph, sizes), "cuda")
    graph = program.graph
    env: dict[int, torch.Tensor] = {}
    args = {**session.weights, **{f"caches.{k}": v for k, v in caches.items()}}
    args.update({f"step.{k}": v for k, v in inputs.items()})
    for var, name in zip(graph.inputs, graph.input_names, strict=True):
        env[var.id] = args[name]
    for i, lowered in enumerate(program.steps):
        eqn = lowered.eqn
        operands = [literal(a) if isinstance(a, Lit) else env[a.id] for a in eqn.inputs]
        want = _as_tuple(CPU.rules[eqn.op](eqn.params, *[o.clone() for o in operands]))
        got = _as_tuple(lowered.rule(eqn.params, *[o.to(device, copy=True) for o in operands]))
        gemm_tol = _gemm_bound(eqn, operands)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            if gemm_tol is not None:
                _check_gemm(f"eqn {i} {eqn.op} result {k}", g.cpu(), w, gemm_tol)
            else:
                _check(f"eqn {i} {eqn.op} result {k}", eqn.op, g.cpu(), w)
        for out, value in zip(eqn.outputs, want, strict=True):
            env[out.id] = value


def _gemm_bound(eqn: Any, operands: list[torch.Tensor]) -> torch.Tensor | None:
    """Per output element, the absolute bound of a sum computed on FP8 tensor cores (tests/cuda/bounds.py):
    linear/grouped_linear with FP8 activations, (2^-10 + 2 k 2^-24) |x'| @ |w'|^T; moe_experts with
    FP8 activations, 2^-6 S. The other ops keep the generic bound."""
    act_quant = getattr(eqn.params, "act_quant", "none")
    if eqn.op in ("linear", "grouped_linear") and act_quant == "fp8_g32":
        k = operands[0].shape[-1]
        return (bounds.FP8_DOT_TOL + 2 * k * 2.0**-24) * bounds.linear_abs_sum(eqn.op, eqn.params, operands)
    if eqn.op == "moe_experts" and act_quant == "fp8_g32":
        x, ids, weights, *ws = operands
        return bounds.MOE_GPU_TOL * bounds.moe_magnitude(eqn.params, x, ids, weights, tuple(ws))
    return None


def _check_gemm(what: str, got: torch.Tensor, want: torch.Tensor, abs_bound: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{list(got.shape)}"
    bound = abs_bound.reshape(want.shape) + torch.finfo(want.dtype).eps * want.float().abs()
    excess = (got.float() - want.float()).abs() - bound
    worst = int(excess.argmax())
    assert float(excess.flatten()[worst]) <= 0, (
        f"{what}: |cuda - cpu| = {float((got.float() - want.float()).abs().flatten()[worst]):.3g} "
        f"> bound {float(bound.flatten()[worst]):.3g} at {worst}"
    )


def _as_tuple(result: Any) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def _check(what: str, op: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{list(got.shape)}"
    if want.dtype in ULP:  # masked entries (-inf) must be masked alike; the finite ones within the bound
        g, w = got.float(), want.float()
        finite = torch.isfinite(w)
        same = torch.equal(finite, torch.isfinite(g)) and torch.equal(g[~finite], w[~finite])
        assert same, (
            f"{what}: non-finite at {int((~torch.isfinite(g)).sum())} places, cpu {int((~finite).sum())}"
        )
        if finite.any():
            bound = ULPS * ULP[want.dtype] * float(w[finite].abs().max()) + 1e-30
            err = float((g[finite] - w[finite]).abs().max())
            assert err <= bound, f"{what}: max |cuda - cpu| = {err:.3g} > {bound:.3g}"
        return
    mismatch = float((got != want).float().mean()) if want.numel() else 0.0
    assert mismatch <= SELECTION_MISMATCH.get(op, 0.0), f"{what}: {mismatch:.2%} of the values differ"


def test_a_fully_captured_decode_replays_without_host_sync(tmp_path: Path) -> None:
    """With every rule capturable (the kernels cover attention and MoE) the decode program is one CUDA
    graph and its replay makes no host sync (sync debug mode "error"); else the eager pieces are named."""
    runner = _runner(tmp_path, SERVING)
    captured, _ = _sessions(runner)
    runner.add(0)
    captured.run(runner.step_inputs([(0, fx.prompt(3, 6))]))
    runner.requests[0].tokens += fx.prompt(3, 6)
    decode = runner.step_inputs([(0, [5])])
    captured.run(decode)
    step = captured.captured[min(captured.captured, key=lambda k: dict(k)["tokens"])]
    assert step.num_eager == 0 and step.num_graphs == 1, step.as_text()
    no_fix = {k: np.full(shape, -1, np.int32) for k, (shape, _) in step.extra.items()}  # no overlap fix
    step.inputs.stage({**{f"step.{k}": v for k, v in decode.items()}, **no_fix})  # decode: its own bucket
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step.launch()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_pdl_launches_give_the_plain_launches_bits(tmp_path: Path) -> None:
    """DSGRAPH_PDL=1 (platform/cuda/pdl.py) changes only when each kernel starts: the same steps, captured
    with programmatic dependent launch (and the GEMMs' weight prefetch), give the plain capture's logits
    bit for bit, prefill and decode; a kernel that read its inputs before waiting would race here."""
    from dsgraph.platform.cuda import pdl

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    runner = _runner(tmp_path, SERVING)
    plain, _ = _sessions(runner)
    with pdl.setting(True):
        launched, _ = _sessions(runner)
    for step, inputs, _want, _before in _steps(runner, 6):
        want = plain.run(inputs)
        with pdl.setting(True):  # each bucket is captured at its first run
            got = launched.run(inputs)
        assert torch.equal(got, want), f"step {step}: PDL logits differ from the plain launches'"
