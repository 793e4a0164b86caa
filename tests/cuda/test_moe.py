"""The cuda MoE rules (moe_route, moe_experts, swiglu; platform/cuda/kernels/moe.py) against the cpu rules.

On a CUDA machine the kernels run on the GPU; elsewhere under Triton's interpreter on tiny shapes. The cpu
reference always runs on CPU copies.

Tolerances:
- swiglu: bit-equal (silu in f64 rounded once, then FP32 products, on both platforms);
- moe_route: the selected experts must be a top-k of the cpu scores (tie-aware: their s + bias equal the
  cpu's top-k values to 2^-12 relative) and the weights equal the cpu formula at those ids to 2^-12
  relative (the gate GEMM sums in another order: up to k 2^-24 of its terms' magnitude);
- moe_experts: every element within TOL * S of the cpu rule, S = sum over the row's experts of
  |a_e| @ |w2_e|^T (the magnitude of the last GEMM's terms), TOL = 2^-6 on the GPU (FP8 tensor-core sums
  flip bf16 and FP8 rounding points of the cpu rule's path now and then; one flip moves a term by 2^-4
  at most) and 2^-10 under the interpreter, where with bf16 GEMM outputs at least 95% of the elements
  must also be bit-equal (its dots are exact FP32 ones and the bf16 rounding absorbs the FP32 summation
  order, so a missed rounding point shows).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.platform.cpu import rules_moe  # noqa: E402
from dsgraph.platform.cpu.quant import fp4_rows_dequantize, fp4_rows_quantize  # noqa: E402
from dsgraph.platform.cpu.step_rows import rowwise_linear  # noqa: E402
from dsgraph.platform.cuda.kernels import moe as cuda_moe  # noqa: E402
from tests.cuda.kernel_env import DEVICE, ON_GPU  # noqa: E402


def _dev(ts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(DEVICE) for t in ts)


def _fp4_experts(num: int, rows: int, cols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(num * rows, cols, generator=gen) * cols**-0.5
    packed, scale = fp4_rows_quantize(w)
    return packed.reshape(num, rows, cols // 2), scale.reshape(num, rows, cols // 32)


def _expert_weights(fmt: str, e: int, h: int, i: int, dtype: torch.dtype, gen: torch.Generator) -> tuple:
    if fmt == "dense":
        return tuple(
            (torch.randn(e, *s, generator=gen) * s[1] ** -0.5).to(dtype) for s in ((i, h), (i, h), (h, i))
        )
    (w1, s1), (w3, s3), (w2, s2) = (_fp4_experts(e, *s, gen) for s in ((i, h), (i, h), (h, i)))
    return w1, w3, w2, s1, s3, s2


def _routing(rows: int, num_experts: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:k] for _ in range(rows)]).to(torch.int32)
    if rows > 2:
        ids[2, -1] = -1  # a padding slot adds nothing
    return ids, torch.rand(rows, k, generator=gen) + 0.1


def _magnitude(p: Any, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ws: tuple) -> torch.Tensor:
    """S of the module docstring, from the cpu rule's own steps."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    xin = rules_moe._gemm_input(p, x, x.dtype)
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        w1, w3, w2 = rules_moe._expert_weights(p, e, ws)
        g, v = rules_moe._gemm(p, xin[rows], w1), rules_moe._gemm(p, xin[rows], w3)
        act = rules_moe.swiglu_f32(g, v, p.swiglu_limit) * weights[rows, slots, None]
        out.index_add_(0, rows, rowwise_linear(act.abs(), w2.abs()))
    return out


def _compare_experts(p: Any, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ws: tuple) -> None:
    ref = rules_moe.moe_experts(p, x, ids, weights, *ws)
    got = cuda_moe.moe_experts(p, *_dev((x, ids, weights)), *_dev(ws)).cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    scale = _magnitude(p, x, ids, weights, ws)
    tol = 2.0**-6 if ON_GPU else 2.0**-10
    excess = (got.float() - ref.float()).abs() - tol * scale - torch.finfo(ref.dtype).eps * ref.float().abs()
    worst = int(excess.argmax())
    assert excess.max() <= 0, (worst, got.flatten()[worst], ref.flatten()[worst], scale.flatten()[worst])
    if not ON_GPU and p.gemm_out_dtype != "f32":
        assert (got == ref).float().mean() >= 0.95


# (weight_format, act_quant, gemm_out_dtype, x dtype, out_dtype): serving first, then W4A16, then dense.
EXPERT_CASES = [
    ("mxfp4_rows", "fp8_g32", "bf16", torch.bfloat16, "f32"),
    ("mxfp4_rows", "fp8_g32", "f32", torch.float32, "bf16"),
    ("mxfp4_rows", "none", "bf16", torch.bfloat16, "f32"),
    ("mxfp4_rows", "none", "f32", torch.float32, "f32"),
    ("dense", "none", "f32", torch.float32, "f32"),
    ("dense", "none", "bf16", torch.bfloat16, "bf16"),
]


@pytest.mark.parametrize("case", EXPERT_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{str(c[3])[6:]}-{c[4]}")
@pytest.mark.parametrize("rows", [1, 9, 70])
def test_moe_experts_matches_cpu_rule(case: tuple, rows: int) -> None:
    fmt, act_quant, gemm_out, x_dtype, out_dtype = case
    gen = torch.Generator().manual_seed(rows)
    hidden, inter, num_experts, k = 64, 96, 6, 3
    p = SimpleNamespace(
        swiglu_limit=2.0, weight_format=fmt, act_quant=act_quant, out_dtype=out_dtype, gemm_out_dtype=gemm_out
    )
    x = (torch.randn(rows, hidden, generator=gen) * 2).to(x_dtype)
    ids, weights = _routing(rows, num_experts, k, gen)
    if rows == 70:
        ids[:66, 0] = 4  # 66 rows of one expert: two row tiles
    ws = _expert_weights(fmt, num_experts, hidden, inter, x_dtype, gen)
    _compare_experts(p, x, ids, weights, ws)


def _compact_experts(ws: tuple, ids: torch.Tensor) -> tuple[tuple, torch.Tensor]:
    """CPU copies of only the experts ids uses, renumbered in the same order (the cpu rule adds a row's
    experts in increasing id, which the renumbering keeps)."""
    used = torch.unique(ids[ids >= 0])
    remap = torch.full((int(ids.max()) + 1,), -1, dtype=torch.int64)
    remap[used] = torch.arange(used.numel())
    new_ids = torch.where(ids >= 0, remap[ids.clamp_min(0).long()], -1).to(torch.int32)
    index = used.to(ws[0].device)
    # e8m0 tensors are indexed through their bytes (not every torch build indexes e8m0 on CUDA)
    picked = tuple(
        w.view(torch.uint8)[index].view(w.dtype) if w.element_size() == 1 else w[index] for w in ws
    )
    return tuple(w.cpu() for w in picked), new_ids


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3])
def test_moe_experts_real_widths_on_gpu(rows: int) -> None:
    """V4.1's 384 experts of 2304 x 5120, top-6, random packed weights made on the GPU."""
    hidden, inter, num_experts, k = 5120, 2304, 384, 6
    gen = torch.Generator(device="cuda").manual_seed(rows)

    def packed(*shape: int) -> torch.Tensor:
        return torch.randint(-128, 128, shape, dtype=torch.int8, device="cuda", generator=gen)

    def scales(*shape: int) -> torch.Tensor:
        e = torch.randint(118, 123, shape, dtype=torch.uint8, device="cuda", generator=gen)
        return e.view(torch.float8_e8m0fnu)

    ws = (
        packed(num_experts, inter, hidden // 2),
        packed(num_experts, inter, hidden // 2),
        packed(num_experts, hidden, inter // 2),
        scales(num_experts, inter, hidden // 32),
        scales(num_experts, inter, hidden // 32),
        scales(num_experts, hidden, inter // 32),
    )
    cpu_gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=cpu_gen).to(torch.bfloat16)
    ids, weights = _routing(rows, num_experts, k, cpu_gen)
    p = SimpleNamespace(
        swiglu_limit=10.0,
        weight_format="mxfp4_rows",
        act_quant="fp8_g32",
        out_dtype="f32",
        gemm_out_dtype="bf16",
    )
    got = cuda_moe.moe_experts(p, *_dev((x, ids, weights)), *ws).cpu()
    small_ws, small_ids = _compact_experts(ws, ids)
    ref = rules_moe.moe_experts(p, x, small_ids, weights, *small_ws)
    scale = _magnitude(p, x, small_ids, weights, small_ws)
    assert ((got - ref).abs() <= 2.0**-6 * scale + 1e-6 * ref.abs()).all()


@pytest.mark.parametrize("act_quant", ["fp8_g32", "none"])
def test_moe_experts_rows_are_batch_invariant(act_quant: str) -> None:
    gen = torch.Generator().manual_seed(7)
    hidden, inter, num_experts, k = 64, 64, 5, 2
    p = SimpleNamespace(
        swiglu_limit=3.0,
        weight_format="mxfp4_rows",
        act_quant=act_quant,
        out_dtype="f32",
        gemm_out_dtype="bf16",
    )
    x = torch.randn(32, hidden, generator=gen).to(torch.bfloat16)
    ids, weights = _routing(32, num_experts, k, gen)
    ws = _dev(_expert_weights("mxfp4_rows", num_experts, hidden, inter, torch.bfloat16, gen))
    x, ids, weights = _dev((x, ids, weights))
    full = cuda_moe.moe_experts(p, x, ids, weights, *ws)
    for size, start in ((1, 0), (1, 31), (7, 3), (7, 25)):
        rows = slice(start, start + size)
        assert torch.equal(cuda_moe.moe_experts(p, x[rows], ids[rows], weights[rows], *ws), full[rows])


def _cpu_scores(u: torch.Tensor, gate_w: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(
        torch.nn.functional.softplus(rowwise_linear(u.float(), gate_w.float()).double()).float()
    )


def _check_route(p: Any, u: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor) -> None:
    weights, ids = (t.cpu() for t in cuda_moe.moe_route(p, *_dev((u, gate_w, bias))))
    ref_weights, ref_ids = rules_moe.moe_route(p, u, gate_w, bias)
    assert ids.dtype == ref_ids.dtype and weights.dtype == ref_weights.dtype and ids.shape == ref_ids.shape
    scores = _cpu_scores(u, gate_w)
    biased = scores + bias
    top = biased.gather(1, ref_ids.long())
    assert torch.allclose(biased.gather(1, ids.long()), top, rtol=2.0**-12, atol=0.0)
    chosen = scores.gather(1, ids.long())
    want = chosen / (chosen.sum(-1, keepdim=True) + 1e-20) * p.routed_scaling
    assert torch.allclose(weights, want, rtol=2.0**-12, atol=0.0)


@pytest.mark.parametrize(
    "dtypes",
    [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (torch.bfloat16, torch.float32)],
)
@pytest.mark.parametrize("row_bias", [False, True])
def test_moe_route_matches_cpu_rule(dtypes: tuple, row_bias: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    rows, hidden, num_experts = 11, 64, 16
    u = torch.randn(rows, hidden, generator=gen).to(dtypes[0])
    gate_w = (torch.randn(num_experts, hidden, generator=gen) * 0.2).to(dtypes[1])
    bias = torch.randn(*((rows,) if row_bias else ()), num_experts, generator=gen) * 0.1
    _check_route(SimpleNamespace(topk=4, routed_scaling=2.5), u, gate_w, bias)


def test_moe_route_ties_go_to_the_lowest_id() -> None:
    u = torch.ones(3, 32)
    gate_w = torch.zeros(8, 32)  # every score equal: the first topk ids in order
    weights, ids = cuda_moe.moe_route(
        SimpleNamespace(topk=3, routed_scaling=1.0), *_dev((u, gate_w, torch.zeros(8)))
    )
    assert ids.cpu().tolist() == [[0, 1, 2]] * 3
    assert torch.allclose(weights.cpu(), torch.full((3, 3), 1 / 3))


@pytest.mark.gpu
def test_moe_route_real_widths_on_gpu() -> None:
    gen = torch.Generator().manual_seed(4)
    u = torch.randn(7, 5120, generator=gen).to(torch.bfloat16)
    gate_w = (torch.randn(384, 5120, generator=gen) * 5120**-0.5).to(torch.bfloat16)
    _check_route(
        SimpleNamespace(topk=6, routed_scaling=2.5), u, gate_w, torch.randn(384, generator=gen) * 0.01
    )


@pytest.mark.parametrize("out_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_swiglu_is_bit_equal(out_dtype: str, in_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    g = (torch.randn(3, 1500, generator=gen) * 6).to(in_dtype)
    v = (torch.randn(3, 1500, generator=gen) * 6).to(in_dtype)
    p = SimpleNamespace(limit=7.0, out_dtype=out_dtype)
    got = cuda_moe.swiglu(p, *_dev((g, v))).cpu()
    ref = rules_moe.swiglu(p, g, v)
    assert got.dtype == ref.dtype and torch.equal(got, ref)


def test_fp4_dequantization_layout_matches_cpu() -> None:
    """W4A16 with FP32 activations and one-hot rows reads single weights: the kernel's unpacking order,
    E2M1 decoding and scales equal the cpu checkpoint dequantizer's."""
    gen = torch.Generator().manual_seed(9)
    hidden, inter = 64, 32
    (w1, s1), (w3, s3), (w2, s2) = (
        _fp4_experts(1, *s, gen) for s in ((inter, hidden), (inter, hidden), (hidden, inter))
    )
    x = torch.eye(hidden)[:5] * 0.5
    ids = torch.zeros(5, 1, dtype=torch.int32)
    p = SimpleNamespace(
        swiglu_limit=100.0,
        weight_format="mxfp4_rows",
        act_quant="none",
        out_dtype="f32",
        gemm_out_dtype="f32",
    )
    got = cuda_moe.moe_experts(p, *_dev((x, ids, torch.ones(5, 1))), *_dev((w1, w3, w2, s1, s3, s2))).cpu()
    dense = [fp4_rows_dequantize(w[0], s[0]) for w, s in ((w1, s1), (w3, s3), (w2, s2))]
    act = rules_moe.swiglu_f32(x @ dense[0].t(), x @ dense[1].t(), 100.0)
    bound = 2 * inter * 2.0**-24 * (act.abs() @ dense[2].abs().t())
    assert ((got - act @ dense[2].t()).abs() <= bound).all()


def test_combine_adds_a_rows_experts_in_increasing_id_order() -> None:
    """((0 + 1) + 2^-24) + 2^-24 is 1 in FP32 (ties to even); another order would give 1 + 2^-23."""
    ids = torch.tensor([[2, 0, 1], [1, 2, -1]], dtype=torch.int32)
    plan = cuda_moe._sort_pairs(ids.to(DEVICE), 3, 64)
    by_expert = torch.tensor([1.0, 2.0**-24, 2.0**-24])
    flat = ids.reshape(-1).long()
    y_pairs = torch.where(flat >= 0, by_expert[flat.clamp_min(0)], float("nan"))  # padding must not be read
    y = y_pairs.to(DEVICE)[plan["order"]][:, None]
    out = cuda_moe._combine(y, plan["row_positions"], plan["real_pairs"]).cpu()
    assert out[:, 0].tolist() == [1.0, 2.0**-23]
