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
  order, so a missed rounding point shows);
- the plan kernel (pairs sorted by expert, tile table): equal to a by-hand stable sort;
- the combine kernel: bit-equal to the cpu rule's combine (index_add_ of each expert in increasing id,
  in FP32, rounded once), and every row bit-identical whatever the batch around it.
The moe_experts tests run on both kernel paths: the swap-AB kernels with the rule's row buckets
(moe.SWAP_BUCKETS), which must really launch where they cover the case, and the base kernels (the rule's
path for the other cases, forced with `swap=None` for the covered ones).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.platform.cpu import rules_moe  # noqa: E402
from dsgraph.platform.cpu.quant import fp4_rows_dequantize, fp4_rows_quantize  # noqa: E402
from dsgraph.platform.cpu.step_rows import rowwise_linear  # noqa: E402
from dsgraph.platform.cuda.kernels import moe as cuda_moe  # noqa: E402
from dsgraph.platform.cuda.scale_bound import scales_at_most_128  # noqa: E402
from tests.cuda.bounds import moe_magnitude  # noqa: E402
from tests.cuda.kernel_env import DEVICE, ON_GPU  # noqa: E402

# kernel path -> the rule's `swap` argument
_T = cuda_moe.SwapTiles
# the sorted rows on the dot's M side (SwapTiles.tokens), both GEMMs, every step size
_TOKENS = ((1 << 62, _T(64, 64, 64, 4, 3, tokens=True), _T(128, 128, 64, 8, 3, tokens=True)),)
VARIANTS: dict[str, cuda_moe.SwapBuckets | None] = {
    "base": None, "swap": cuda_moe.SWAP_BUCKETS, "tokens": _TOKENS
}  # fmt: skip
# the rule itself: a test runs a path by replacing cuda_moe.moe_experts with it bound to that path
MOE_EXPERTS = cuda_moe.moe_experts


def _mxfp4_params(
    limit: float, act_quant: str = "fp8_g32", out_dtype: str = "f32", gemm_out_dtype: str = "bf16"
) -> SimpleNamespace:
    """moe_experts params over packed MXFP4 experts (the serving case by default: W4A8, BF16 GEMM out)."""
    return SimpleNamespace(
        swiglu_limit=limit, weight_format="mxfp4_rows", act_quant=act_quant, out_dtype=out_dtype,
        gemm_out_dtype=gemm_out_dtype,
    )  # fmt: skip


@pytest.fixture(params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test with moe_experts on one kernel path."""
    monkeypatch.setattr(cuda_moe, "moe_experts", functools.partial(MOE_EXPERTS, swap=VARIANTS[request.param]))
    return request.param


def _swap_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts launches of the swap kernels (one entry per launch)."""
    from dsgraph.platform.cuda.kernels import moe_swap_tl

    seen: list[int] = []
    launch = moe_swap_tl.launch_swap_gemm

    def spy(*args: Any) -> None:
        seen.append(1)
        launch(*args)

    monkeypatch.setattr(moe_swap_tl, "launch_swap_gemm", spy)
    return seen


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


def _compare_experts(p: Any, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ws: tuple) -> None:
    ref = rules_moe.moe_experts(p, x, ids, weights, *ws)
    got = cuda_moe.moe_experts(p, *_dev((x, ids, weights)), *_dev(ws)).cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    scale = moe_magnitude(p, x, ids, weights, ws)
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
def test_moe_experts_matches_cpu_rule(
    case: tuple, rows: int, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt, act_quant, gemm_out, x_dtype, out_dtype = case
    p = SimpleNamespace(
        swiglu_limit=2.0, weight_format=fmt, act_quant=act_quant, out_dtype=out_dtype, gemm_out_dtype=gemm_out
    )
    swap = variant != "base" and cuda_moe._swap_covers(p, torch.empty(0, dtype=x_dtype))
    if variant != "base" and not swap:
        pytest.skip("the rule runs the base kernels here")
    launches = _swap_launches(monkeypatch)
    gen = torch.Generator().manual_seed(rows)
    hidden, inter, num_experts, k = 64, 96, 6, 3
    x = (torch.randn(rows, hidden, generator=gen) * 2).to(x_dtype)
    ids, weights = _routing(rows, num_experts, k, gen)
    if rows == 70:
        ids[:66, 0] = 4  # 66 rows of one expert: two row tiles
    ws = _expert_weights(fmt, num_experts, hidden, inter, x_dtype, gen)
    _compare_experts(p, x, ids, weights, ws)
    assert len(launches) == (2 if swap else 0)


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
def test_moe_experts_real_widths_on_gpu(rows: int, variant: str) -> None:
    """V4.1's 384 experts of 2304 x 5120, top-6, random packed weights made on the GPU."""
    from dsgraph.tools.bench.moe_sweep import EXPERTS, HIDDEN, TOPK, random_experts

    hidden, num_experts, k = HIDDEN, EXPERTS, TOPK
    ws = random_experts(torch.Generator(device="cuda").manual_seed(rows))  # the sweep's, on the device
    cpu_gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=cpu_gen).to(torch.bfloat16)
    ids, weights = _routing(rows, num_experts, k, cpu_gen)
    p = _mxfp4_params(10.0)
    got = cuda_moe.moe_experts(p, *_dev((x, ids, weights)), *ws).cpu()
    small_ws, small_ids = _compact_experts(ws, ids)
    ref = rules_moe.moe_experts(p, x, small_ids, weights, *small_ws)
    scale = moe_magnitude(p, x, small_ids, weights, small_ws)
    assert ((got - ref).abs() <= 2.0**-6 * scale + 1e-6 * ref.abs()).all()


@pytest.mark.parametrize("act_quant", ["fp8_g32", "none"])
def test_moe_experts_rows_are_batch_invariant(act_quant: str, variant: str) -> None:
    _check_batch_invariance(act_quant)


def test_moe_experts_rows_are_batch_invariant_across_the_bucket_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule's first bucket made to end at 8 rows: the 32-row batch runs the next bucket's tiles and
    its 1- and 7-row parts the first's; every row must come out bit-identical."""
    (_, gated, down), *rest = cuda_moe.SWAP_BUCKETS
    assert rest, "SWAP_BUCKETS has one bucket: nothing to switch between"
    monkeypatch.setattr(
        cuda_moe, "moe_experts", functools.partial(MOE_EXPERTS, swap=((8, gated, down), *rest))
    )
    launches = _swap_launches(monkeypatch)
    _check_batch_invariance("fp8_g32")
    assert launches


def _check_batch_invariance(act_quant: str) -> None:
    gen = torch.Generator().manual_seed(7)
    hidden, inter, num_experts, k = 128, 128, 5, 2
    p = _mxfp4_params(3.0, act_quant=act_quant)
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


def test_moe_route_selects_in_one_launch_with_the_sorts_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The selection kernel (moe_route_tl.py) against the cpu rule's stable descending sort, ids exactly:
    ties of s + bias between different scores (lowest id first), a bias of -inf that rules an expert
    out, a NaN key (first, as the sort puts it), a [1, E] bias broadcast to every row."""
    from dsgraph.platform.cuda.kernels import moe_route_tl

    launches: list[int] = []
    real = moe_route_tl.launch_route_select
    monkeypatch.setattr(moe_route_tl, "launch_route_select", lambda *a: launches.append(1) or real(*a))
    gen = torch.Generator().manual_seed(9)
    rows, hidden, num_experts = 5, 32, 12
    u = torch.randn(rows, hidden, generator=gen)
    gate_w = torch.randn(num_experts, hidden, generator=gen) * 0.3
    p = SimpleNamespace(topk=4, routed_scaling=2.0)
    # s + bias equal for experts 3 and 7 in every row: the bias makes up their score difference
    s = torch.sqrt(torch.nn.functional.softplus(rowwise_linear(u, gate_w).double()).float())
    bias = torch.zeros(rows, num_experts)
    bias[:, 7] = s[:, 3] + 10.0 - s[:, 7]
    bias[:, 3] = 10.0
    bias[:, 5] = float("-inf")
    for b in (bias, bias[:1], torch.full((num_experts,), 0.5)):
        weights, ids = (t.cpu() for t in cuda_moe.moe_route(p, *_dev((u, gate_w, b))))
        ref_weights, ref_ids = rules_moe.moe_route(p, u, gate_w, b)
        assert torch.equal(ids, ref_ids)
        assert torch.allclose(weights, ref_weights, rtol=2.0**-20, atol=0.0)
    assert launches
    nan_bias = torch.zeros(num_experts)
    nan_bias[9] = float("nan")
    ids = cuda_moe.moe_route(p, *_dev((u, gate_w, nan_bias)))[1].cpu()
    assert (ids[:, 0] == 9).all() and torch.equal(ids, rules_moe.moe_route(p, u, gate_w, nan_bias)[1])


def test_moe_route_scores_in_the_kernel_follow_softplus_over_its_whole_range() -> None:
    """The kernel's sqrt(softplus) of the logits (f64 softplus, f32 root) against the cpu rule's over logits
    from -60 to 60 (log1p's small-argument range, the switch at 20, exact zeros): one-hot rows make each
    row's logits one column of the gate weight, exactly (consecutive values of the sorted range, so each
    range is among some row's top-k); ids equal, weights within an f32 ulp."""
    num_experts, topk = 64, 8
    grid = torch.cat([torch.linspace(-60, 60, 1601), torch.tensor([0.0, 20.0, 20.0001, 19.9999, -20.0])])
    columns = -(-grid.numel() // num_experts)
    gate_w = torch.zeros(num_experts * columns)
    gate_w[: grid.numel()] = grid.sort().values
    # [E, columns]: row r of u picks column r, 64 consecutive logits, so every range gets selected
    gate_w = gate_w.reshape(columns, num_experts).T.contiguous()
    u = torch.eye(columns)
    p = SimpleNamespace(topk=topk, routed_scaling=1.5)
    bias = torch.zeros(num_experts)
    weights, ids = (t.cpu() for t in cuda_moe.moe_route(p, *_dev((u, gate_w, bias))))
    ref_weights, ref_ids = rules_moe.moe_route(p, u, gate_w, bias)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(weights, ref_weights, rtol=2.0**-21, atol=0.0)


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
    # NaN and infinities in either input: the clamps keep a NaN (a GPU min or max would drop it)
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    g[0, :3], v[1, :3], g[2, :3], v[2, 3:6] = special, special, special, special.flip(0)
    p = SimpleNamespace(limit=7.0, out_dtype=out_dtype)
    got = cuda_moe.swiglu(p, *_dev((g, v))).cpu()
    ref = rules_moe.swiglu(p, g, v)
    assert ref.isnan().any()
    assert got.dtype == ref.dtype and torch.equal(got.isnan(), ref.isnan())
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


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
    p = _mxfp4_params(100.0, act_quant="none", gemm_out_dtype="f32")
    got = cuda_moe.moe_experts(p, *_dev((x, ids, torch.ones(5, 1))), *_dev((w1, w3, w2, s1, s3, s2))).cpu()
    dense = [fp4_rows_dequantize(w[0], s[0]) for w, s in ((w1, s1), (w3, s3), (w2, s2))]
    act = rules_moe.swiglu_f32(x @ dense[0].t(), x @ dense[1].t(), 100.0)
    bound = 2 * inter * 2.0**-24 * (act.abs() @ dense[2].abs().t())
    assert ((got - act @ dense[2].t()).abs() <= bound).all()


def _plan_reference(ids: torch.Tensor, weights: torch.Tensor, num_experts: int, block_m: int) -> dict:
    """The plan by hand: pairs in (expert, pair index) order, padding and bad ids last; tiles per expert."""
    flat = ids.reshape(-1).tolist()
    key = [e if 0 <= e < num_experts else num_experts for e in flat]
    order = sorted(range(len(flat)), key=lambda q: (key[q], q))
    position = [0] * len(flat)
    for place, q in enumerate(order):
        position[q] = place
    tiles = []
    for e in range(num_experts):
        first, count = sum(k < e for k in key), key.count(e)
        tiles += [(e, first + i, first + count) for i in range(0, count, block_m)]
    num_tiles = -(-len(flat) // block_m) + min(num_experts, len(flat))
    real = len(tiles)
    return {
        "token": [q // ids.shape[1] for q in order],
        "route": weights.reshape(-1)[order],
        "position": position,
        "tiles": tiles,
        "tile_expert": [t[0] for t in tiles] + [num_experts] * (num_tiles - real),
        "real_tiles": real,
    }


@pytest.mark.parametrize("block_p", [None, 16])
@pytest.mark.parametrize(
    ("rows", "k", "num_experts", "block_m"), [(1, 1, 1, 64), (9, 3, 5, 4), (70, 6, 20, 8)]
)
def test_plan_sorts_pairs_stably_by_expert(
    monkeypatch: pytest.MonkeyPatch, block_p: int | None, rows: int, k: int, num_experts: int, block_m: int
) -> None:
    """The plan kernel against a by-hand stable sort; block_p 16 walks the pairs in several blocks."""
    from dsgraph.platform.cuda.kernels import moe_tl

    if block_p is not None:
        monkeypatch.setattr(moe_tl, "PLAN_BLOCK_P", block_p)
    gen = torch.Generator().manual_seed(rows)
    ids = torch.randint(-1, num_experts, (rows, k), generator=gen, dtype=torch.int32)
    if rows > 2:
        ids[: rows // 2, 0] = num_experts - 1  # one expert with many pairs: several tiles
        ids[1, -1] = num_experts + 3  # out of range: treated as padding (the host check is separate)
    weights = torch.rand(rows, k, generator=gen)
    got = {key: t.cpu() for key, t in cuda_moe._plan(*_dev((ids, weights)), num_experts, block_m).items()}
    want = _plan_reference(ids, weights, num_experts, block_m)
    assert got["token"].tolist() == want["token"]
    assert torch.equal(got["route"], want["route"])
    assert got["position"].tolist() == want["position"]
    assert got["tile_expert"].tolist() == want["tile_expert"]
    real = want["real_tiles"]
    table = list(zip(got["tile_expert"][:real].tolist(), got["tile_start"][:real].tolist(),
                     got["tile_end"][:real].tolist(), strict=True))  # fmt: skip
    assert table == want["tiles"]


def _cpu_combine(y_pairs: torch.Tensor, ids: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The cpu rule's combine step: index_add_ of each expert's pairs, experts in increasing id."""
    out = torch.zeros((ids.shape[0], y_pairs.shape[-1]), dtype=torch.float32)
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        out.index_add_(0, rows, y_pairs[rows, slots].float())
    return out.to(out_dtype)


def _run_combine(
    y_pairs: torch.Tensor, ids: torch.Tensor, num_experts: int, out_dtype: torch.dtype
) -> torch.Tensor:
    """The combine kernel on y laid out in the plan's sorted places (padding places hold NaN)."""
    from dsgraph.platform.cuda.kernels import moe_tl

    plan = cuda_moe._plan(*_dev((ids, torch.ones(ids.shape))), num_experts, 64)
    position = plan["position"].cpu().long()
    y = torch.full((ids.numel(), y_pairs.shape[-1]), float("nan"), dtype=y_pairs.dtype)
    real = (ids.reshape(-1) >= 0) & (ids.reshape(-1) < num_experts)
    y[position[real]] = y_pairs.reshape(ids.numel(), -1)[real]  # padding places stay NaN: never read
    out = torch.empty((ids.shape[0], y_pairs.shape[-1]), dtype=out_dtype, device=DEVICE)
    moe_tl.launch_combine(y.to(DEVICE), ids.to(DEVICE), plan["position"], num_experts, out)
    return out.cpu()


def test_combine_adds_a_rows_experts_in_increasing_id_order() -> None:
    """((0 + 1) + 2^-24) + 2^-24 is 1 in FP32 (ties to even); another order would give 1 + 2^-23."""
    ids = torch.tensor([[2, 0, 1], [1, 2, -1]], dtype=torch.int32)
    by_expert = torch.tensor([1.0, 2.0**-24, 2.0**-24])
    y_pairs = by_expert[ids.clamp_min(0).long()][..., None]
    out = _run_combine(y_pairs, ids, 3, torch.float32)
    assert out[:, 0].tolist() == [1.0, 2.0**-23]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("y_dtype", [torch.float32, torch.bfloat16])
def test_combine_is_bit_equal_to_the_cpu_rules_sum(y_dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    """Random expert outputs of mixed magnitudes (so the order shows), repeated ids, padding, -0."""
    gen = torch.Generator().manual_seed(3)
    rows, k, num_experts, hidden = 10, 6, 9, 1100  # hidden above one 1024-column block
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:k] for _ in range(rows)]).to(torch.int32)
    ids[2, 1:3], ids[4, 0], ids[5, :] = -1, ids[4, 3], -1  # padding, a repeated id, a row of padding only
    y = torch.randn(rows, k, hidden, generator=gen) * torch.exp2(
        torch.randint(-12, 10, (rows, k, 1), generator=gen)
    )
    y[7, :, :10] = -0.0
    y = y.to(y_dtype)
    got = _run_combine(y, ids, num_experts, out_dtype)
    want = _cpu_combine(y, ids, out_dtype)
    bits = torch.int32 if out_dtype == torch.float32 else torch.int16
    assert torch.equal(got.view(bits), want.view(bits))
    assert not torch.signbit(got[5]).any() and not torch.signbit(got[7, :10]).any()


def test_moe_experts_equals_the_cpu_rule_combine_of_its_pair_outputs(
    monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """The whole rule: its result is the cpu rule's combine of the w2 GEMM's outputs (captured)."""
    from dsgraph.platform.cuda.kernels import moe_tl

    gen = torch.Generator().manual_seed(11)
    rows, hidden, inter, num_experts, k = 20, 64, 64, 5, 3
    p = _mxfp4_params(3.0, out_dtype="bf16")
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    ids, weights = _routing(rows, num_experts, k, gen)
    ws = _dev(_expert_weights("mxfp4_rows", num_experts, hidden, inter, torch.bfloat16, gen))
    seen = {}
    combine = moe_tl.launch_combine

    def spy(y: torch.Tensor, ids: torch.Tensor, position: torch.Tensor, num: int, out: torch.Tensor) -> None:
        seen.update(y=y.cpu(), position=position.cpu())
        combine(y, ids, position, num, out)

    monkeypatch.setattr(moe_tl, "launch_combine", spy)
    got = cuda_moe.moe_experts(p, *_dev((x, ids, weights)), *ws).cpu()
    y_pairs = seen["y"][seen["position"].long()].reshape(rows, k, hidden)
    assert torch.equal(got.view(torch.int16), _cpu_combine(y_pairs, ids, torch.bfloat16).view(torch.int16))


def test_moe_experts_rows_are_batch_invariant_across_plan_blocks(
    monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """With 8-pair plan blocks a row's pairs land in other blocks and places as the batch changes (subsets,
    reversed order); its result must not change by a bit."""
    from dsgraph.platform.cuda.kernels import moe_tl

    monkeypatch.setattr(moe_tl, "PLAN_BLOCK_P", 8)
    gen = torch.Generator().manual_seed(5)
    rows, hidden, inter, num_experts, k = 12, 32, 32, 4, 2
    p = _mxfp4_params(3.0)
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    ids, weights = _routing(rows, num_experts, k, gen)
    ws = _dev(_expert_weights("mxfp4_rows", num_experts, hidden, inter, torch.bfloat16, gen))
    x, ids, weights = _dev((x, ids, weights))
    full = cuda_moe.moe_experts(p, x, ids, weights, *ws)
    flipped = torch.arange(rows - 1, -1, -1, device=DEVICE)
    assert torch.equal(
        cuda_moe.moe_experts(p, x[flipped], ids[flipped], weights[flipped], *ws), full[flipped]
    )
    for part in (slice(0, 1), slice(5, 12), slice(2, 3)):
        assert torch.equal(cuda_moe.moe_experts(p, x[part], ids[part], weights[part], *ws), full[part])


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [64, 4096])
def test_plan_at_real_widths_on_gpu(rows: int) -> None:
    """384 experts, top-6, decode and prefill row counts (several plan blocks), against torch's stable
    sort on the CPU."""
    num_experts, k, block_m = 384, 6, cuda_moe.GATED_TILES[0]
    gen = torch.Generator().manual_seed(rows)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:k] for _ in range(rows)]).to(torch.int32)
    ids[: rows // 2, 0] = 7  # one expert with many tiles
    ids[3, 2] = -1
    weights = torch.rand(rows, k, generator=gen)
    got = {key: t.cpu() for key, t in cuda_moe._plan(*_dev((ids, weights)), num_experts, block_m).items()}
    flat = ids.reshape(-1).long()
    order = torch.sort(torch.where(flat >= 0, flat, num_experts), stable=True).indices
    assert torch.equal(got["token"].long(), order // k) and torch.equal(
        got["route"], weights.reshape(-1)[order]
    )
    assert torch.equal(got["position"].long()[order], torch.arange(flat.numel()))
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    starts = torch.cumsum(counts, 0) - counts
    per = (counts + block_m - 1) // block_m
    expert = torch.repeat_interleave(torch.arange(num_experts), per)
    first = torch.cat([starts[e] + torch.arange(int(per[e])) * block_m for e in range(num_experts)])
    real = expert.numel()
    assert torch.equal(got["tile_expert"][:real].long(), expert)
    assert (got["tile_expert"][real:] == num_experts).all()
    assert torch.equal(got["tile_start"][:real].long(), first)
    assert torch.equal(got["tile_end"][:real].long(), (starts + counts)[expert])


@pytest.mark.parametrize("tiles", [dict(scaled=True), dict(tokens=True), dict(block_w=32, num_warps=1)])
def test_swap_tiles_refuse_an_asm_upcast_they_cannot_run(tiles: dict[str, Any]) -> None:
    given = dict(block_w=64, block_t=16, block_k=64, num_warps=2, num_stages=3, asm=True) | tiles
    with pytest.raises(ValueError, match="moe swap tiles"):
        cuda_moe.SwapTiles(**given)


@pytest.mark.gpu
def test_token_tiles_have_the_prefill_tiles_bits() -> None:
    """The sorted rows on the dot's M side (SwapTiles.tokens) sum the same exact products in the same K
    order as the default's prefill tiles: the same bits (a candidate may replace them only then)."""
    gen = torch.Generator().manual_seed(11)
    rows, hidden, inter, num_experts, k = 600, 256, 192, 6, 3
    p = _mxfp4_params(7.0)
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    ids, weights = _routing(rows, num_experts, k, gen)
    ws = _expert_weights("mxfp4_rows", num_experts, hidden, inter, torch.bfloat16, gen)
    args = _dev((x, ids, weights, *ws))
    prefill = cuda_moe.SWAP_BUCKETS[-1]
    want = MOE_EXPERTS(p, *args, swap=((1 << 62, prefill[1], prefill[2]),))
    assert torch.equal(MOE_EXPERTS(p, *args, swap=_TOKENS), want)


def _extreme_scales(ws: tuple[torch.Tensor, ...], gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """ws with about 1 in 16 scale bytes set to 0 (2^-127, subnormal in BF16) or 1, expert 1's with 140
    (2^13: large but finite) and expert 0's with 254 (2^127: infinities) or
    255 (NaN) too: rows routed elsewhere stay finite."""
    out = list(ws)
    for i in (3, 4, 5):
        s = ws[i].view(torch.uint8).clone()
        pick = torch.randint(0, 32, s.shape, generator=gen)
        for code, byte in enumerate((0, 1)):
            s[pick == code] = byte
        s[1][pick[1] == 2] = 140
        s[0][pick[0] == 2] = 254
        s[0][pick[0] == 3] = 255
        out[i] = s.view(ws[i].dtype)
    return tuple(out)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "layout", [(64, 2, 16), (64, 4, 16), (128, 4, 16), (128, 8, 16), (64, 4, 64), (64, 4, 128)]
)
def test_asm_upcast_has_the_dequantization_bits_on_every_layout(layout: tuple[int, int, int]) -> None:
    """The inline-PTX upcast gives each packed byte its own scale, so its bits may not depend on how
    Triton lays the bytes out over the threads: every (weight rows, warps) layout must match the kernel's
    own word-wise dequantization bit for bit (NaN where it has NaN), in its one-multiply form (every
    scale byte at most 128) and in its two-multiply form (extreme scale bytes). Layouts: (weight rows,
    warps, sorted rows), the decode tiles' 16 sorted rows and the prefill tiles' 64 and 128."""
    block_w, warps, block_t = layout
    asm = cuda_moe.SwapTiles(block_w, block_t, 64, warps, 3, asm=True)
    ref = cuda_moe.SwapTiles(block_w, block_t, 64, warps, 3)
    gen = torch.Generator().manual_seed(block_w + warps + block_t)
    rows, hidden, inter, num_experts, k = 24, 256, 192, 6, 3
    p = _mxfp4_params(7.0, gemm_out_dtype="bf16")
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    ids, weights = _routing(rows, num_experts, k, gen)
    ws = _expert_weights("mxfp4_rows", num_experts, hidden, inter, torch.bfloat16, gen)
    for case, one in ((ws, True), (_extreme_scales(ws, gen), False)):  # the PTX's two forms
        args = _dev((x, ids, weights, *case))
        assert scales_at_most_128(*args[6:9]) is one
        got = MOE_EXPERTS(p, *args, swap=((1 << 62, asm, asm),))
        want = MOE_EXPERTS(p, *args, swap=((1 << 62, ref, ref),))
        assert got.isfinite().any(), "the case must test finite values too"
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        # a NaN scale byte makes its rows NaN as in the cpu rule (the SwiGLU's clamps keep NaN)
        assert torch.equal(got.isnan().cpu(), rules_moe.moe_experts(p, x, ids, weights, *case).isnan())
