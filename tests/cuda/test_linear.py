"""The cuda `linear` / `grouped_linear` rules (Triton, platform/cuda/kernels/linear.py) against the cpu rules.

On a CUDA machine the kernels run on the GPU; elsewhere under Triton's interpreter (TRITON_INTERPRET=1,
set before triton is imported) on tiny shapes. The cpu reference always runs on CPU copies.

Tolerance of one output element, from `abs_sum = |x'| @ |w'|^T` (x', w' the cpu rule's f32 GEMM operands)
and the reference value r: `|y - r| <= ACC_TOL * abs_sum + eps(out_dtype) * |r|`. ACC_TOL is 2 k 2^-24,
the bound of two FP32 summations of k terms in different orders (the products are exact on both sides:
bf16 x bf16 (FP8 weights and FP8-g32 activations are exact bf16 operands), the interpreter's FP32 dots),
plus on the GPU 2^-16 for bf16/f16 tensor-core dots. eps(out) covers one rounding step of the output
cast (bf16 2^-7, f16 2^-10, f32 2^-23).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.platform.cpu import rules_core, rules_quant  # noqa: E402
from dsgraph.platform.cpu.dtypes import to_torch  # noqa: E402
from dsgraph.platform.cpu.quant import fp8_block_quantize, fp8_g32_quantize  # noqa: E402
from dsgraph.platform.cuda.kernels import linear as cuda_linear  # noqa: E402
from tests.cuda.kernel_env import DEVICE, ON_GPU  # noqa: E402

TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _params(weight_format: str, act_quant: str, out_dtype: str) -> Any:
    return SimpleNamespace(weight_format=weight_format, act_quant=act_quant, out_dtype=out_dtype)


def _weight(weight_format: str, rows: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> tuple:
    w = torch.randn(rows, k, generator=gen) * k**-0.5
    if weight_format == "dense":
        return (w.to(dtype),)
    # Blocks of very different magnitudes exercise every scale byte.
    w = (
        w
        * torch.exp2(torch.randint(-6, 7, (-(-rows // 32), 1), generator=gen)).repeat_interleave(32, 0)[:rows]
    )
    return fp8_block_quantize(w)


def _acc_tol(p: Any, x_dtype: torch.dtype, w: torch.Tensor) -> float:
    """The accumulation term of the tolerance (module docstring), per abs_sum."""
    k = w.shape[1]
    summation = 2 * k * 2.0**-24  # two FP32 sums of k terms in different orders: (k - 1) u sum|terms| each
    if not ON_GPU:
        return summation
    if x_dtype in (torch.bfloat16, torch.float16) or p.weight_format != "dense":
        return 2.0**-16 + summation  # bf16/f16 dots, or f32 x split into bf16 pieces
    return summation


def _check(p: Any, y: torch.Tensor, ref: torch.Tensor, abs_sum: torch.Tensor, acc_tol: float) -> None:
    assert y.dtype == ref.dtype and y.shape == ref.shape, (y.dtype, y.shape, ref.dtype, ref.shape)
    y, ref = y.cpu().float(), ref.float()
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))
    bound = acc_tol * abs_sum + torch.finfo(TORCH[p.out_dtype]).eps * ref.abs()
    excess = (y - ref).abs() - bound
    worst = int(excess.argmax())
    assert excess.max() <= 0, (
        f"element {worst}: got {y.flatten()[worst]}, cpu rule {ref.flatten()[worst]}, "
        f"bound {bound.flatten()[worst]}"
    )


def _compare_linear(p: Any, x: torch.Tensor, w: tuple) -> None:
    ref = rules_core.linear(p, x, *w)
    xf, wf = rules_core.linear_operands(p, x, *w)
    abs_sum = xf.abs() @ wf.abs().t()
    y = cuda_linear.linear(p, x.to(DEVICE), *(t.to(DEVICE) for t in w))
    _check(p, y, ref, abs_sum, _acc_tol(p, x.dtype, w[0]))


# (weight_format, act_quant, x dtype, out_dtype): the serving combinations first.
CASES = [
    ("fp8_block32", "fp8_g32", torch.bfloat16, "bf16"),
    ("fp8_block32", "fp8_g32", torch.float32, "f32"),
    ("fp8_block32", "fp8_g32", torch.bfloat16, "f32"),
    ("fp8_block32", "none", torch.bfloat16, "bf16"),
    ("fp8_block32", "none", torch.float32, "f32"),
    ("fp8_block32", "none", torch.float16, "f16"),
    ("dense", "none", torch.bfloat16, "f32"),
    ("dense", "none", torch.float32, "f32"),
    ("dense", "none", torch.float16, "bf16"),
]
# (M, N, K): one row; partial M/N/K tiles; N not a multiple of 32 (a partial scale block); two M tiles.
TINY_SHAPES = [(1, 64, 64), (5, 96, 160), (3, 40, 288), (70, 130, 96)]
# Real V4.1 widths (GPU only): wq_a, wkv, shared expert w1 and w2, wo_b, indexer wq_b.
REAL_SHAPES = [(1280, 5120), (512, 5120), (2304, 5120), (5120, 2304), (5120, 8192), (4096, 1280)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{str(c[2])[6:]}-{c[3]}")
@pytest.mark.parametrize("shape", TINY_SHAPES, ids=str)
def test_linear_matches_cpu_rule(case: tuple, shape: tuple[int, int, int]) -> None:
    weight_format, act_quant, x_dtype, out_dtype = case
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    if act_quant == "fp8_g32" and k % 32:
        pytest.skip("fp8_g32 needs k % 32 == 0")
    x = (torch.randn(m, k, generator=gen) * 3).to(x_dtype)
    _compare_linear(
        _params(weight_format, act_quant, out_dtype), x, _weight(weight_format, n, k, x_dtype, gen)
    )


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("nk", REAL_SHAPES, ids=str)
@pytest.mark.parametrize("act", [("fp8_g32", torch.bfloat16), ("none", torch.float32)], ids=str)
def test_linear_real_widths_on_gpu(rows: int, nk: tuple[int, int], act: tuple) -> None:
    """Serving's FP8 linears; act_quant none with f32 x is wo_b after the wo_a output's FP8 qdq."""
    gen = torch.Generator().manual_seed(rows + nk[0])
    x = torch.randn(rows, nk[1], generator=gen).to(act[1])
    w = _weight("fp8_block32", *nk, torch.bfloat16, gen)
    _compare_linear(_params("fp8_block32", act[0], "bf16"), x, w)


def test_linear_keeps_leading_dims() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    w = _weight("fp8_block32", 48, 64, torch.bfloat16, gen)
    p = _params("fp8_block32", "fp8_g32", "f32")
    y = cuda_linear.linear(p, x.to(DEVICE), *(t.to(DEVICE) for t in w))
    assert y.shape == (2, 3, 48)
    flat = cuda_linear.linear(p, x.reshape(6, 64).to(DEVICE), *(t.to(DEVICE) for t in w))
    assert torch.equal(y.reshape(6, 48), flat)


@pytest.mark.parametrize(
    ("groups", "n", "k", "rows"), [(2, 32, 64, 3), (4, 24, 96, 5)] + ([(8, 1024, 4096, 9)] if ON_GPU else [])
)
@pytest.mark.parametrize("act_quant", ["fp8_g32", "none"])
def test_grouped_linear_matches_cpu_rule(groups: int, n: int, k: int, rows: int, act_quant: str) -> None:
    gen = torch.Generator().manual_seed(groups * n + k)
    p = _params("fp8_block32", act_quant, "f32")
    x = torch.randn(rows, groups, k, generator=gen).to(torch.bfloat16)
    w = _weight("fp8_block32", groups * n, k, torch.bfloat16, gen)
    ref = rules_quant.grouped_linear(p, x, *w)
    xf, wf = rules_core.linear_operands(p, x, *w)
    per_group = wf.reshape(groups, n, k).abs()
    abs_sum = torch.einsum("tgk,gnk->tgn", xf.abs(), per_group)
    y = cuda_linear.grouped_linear(p, x.to(DEVICE), *(t.to(DEVICE) for t in w))
    _check(p, y, ref, abs_sum, _acc_tol(p, x.dtype, w[0]))


@pytest.mark.parametrize("weight_format", ["fp8_block32", "dense"])
def test_linear_rows_are_batch_invariant(weight_format: str) -> None:
    """Each row's output bits are the same alone, in a batch of 7, 32 and 70 (two M tiles): batches that
    pick different TILE_TABLE entries (1 and 7, 32, 70)."""
    gen = torch.Generator().manual_seed(11)
    k, n = 96, 160
    act_quant = "fp8_g32" if weight_format != "dense" else "none"
    p = _params(weight_format, act_quant, "f32")
    x = (torch.randn(70, k, generator=gen) * 2).to(torch.bfloat16).to(DEVICE)
    w = tuple(t.to(DEVICE) for t in _weight(weight_format, n, k, torch.bfloat16, gen))
    full = cuda_linear.linear(p, x, *w)
    for size in (1, 7, 32):
        for start in (0, 70 - size):
            part = cuda_linear.linear(p, x[start : start + size], *w)
            assert torch.equal(part, full[start : start + size]), (size, start)


def _quantize_kernel(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from dsgraph.platform.cuda.kernels import quant_tl

    rows, width = x.shape
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(rows, width // 32, dtype=torch.float32, device=x.device)
    quant_tl.fp8_g32_quantize_kernel[(-(-rows // 16), width // 32)](x, q, s, rows, width, BLOCK_M=16)
    return q, s


def test_activation_quantization_is_bit_exact() -> None:
    """The in-kernel FP8-g32 codec gives the cpu codec's bytes, including its rounding boundaries."""
    gen = torch.Generator().manual_seed(5)
    groups = [
        torch.randn(32, generator=gen) * 10.0 ** float(e) for e in range(-9, 10, 3)
    ]  # scales from 2^-30 to 2^30
    e4m3 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mid = (e4m3[1:] + e4m3[:-1]) / 2  # exact midpoints (ties to even), and one ulp either side
    ties = torch.cat([mid, mid.nextafter(torch.tensor(0.0)), mid.nextafter(torch.tensor(1e9))])
    ties = torch.cat([ties, -ties])
    ties = torch.nn.functional.pad(ties, (0, -ties.numel() % 31)).reshape(-1, 31)
    # 448 in each group makes the scale 1, so the values round at their own size.
    groups += list(torch.cat([ties, torch.full((ties.shape[0], 1), 448.0)], dim=1))
    groups += [torch.zeros(32), torch.full((32,), -0.0), torch.full((32,), 1e-30), torch.full((32,), 3e37)]
    x = torch.stack(groups)
    x[-4, 3] = -0.0
    q, s = _quantize_kernel(x.to(DEVICE))
    want_q, want_s = fp8_g32_quantize(x)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(s.cpu(), want_s)


def test_activation_quantization_of_non_finite_groups_is_the_cpu_codecs() -> None:
    """A group holding a NaN or an infinity gets the cpu codec's scale (-0 or +inf) and bytes (NaN, +-448
    and zeros as its division gives them): the GPU's max and min would drop the NaN, and the scale's
    reciprocal from its exponent bits is not 1 / scale there."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, 32, generator=gen) * 3
    x[0, 4] = float("nan")
    x[1, 0], x[1, 9] = float("nan"), 0.0
    x[2, 31] = float("inf")
    x[3, 7], x[3, 8] = -float("inf"), -0.0
    x[4, :] = float("nan")
    x[5, 2], x[5, 3] = float("inf"), float("nan")
    q, s = _quantize_kernel(x.to(DEVICE))
    want_q, want_s = fp8_g32_quantize(x)
    assert want_q.float().isnan().any() and want_s.isinf().any() and (want_s == 0).any()
    assert torch.equal(s.cpu().view(torch.int32), want_s.view(torch.int32))
    got, want = q.cpu().float(), want_q.float()
    assert torch.equal(got.isnan(), want.isnan())  # a NaN's sign bit is the platform's
    assert torch.equal(got[~got.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))


def test_linear_reads_no_scale_past_k() -> None:
    """With BLOCK_K 128 and K = 96 the last K step has an empty 32-column chunk: its scale byte (past the
    last scale row) must not be read. Here that byte is 255, UE8M0's NaN, which 0 * NaN would spread."""
    from dsgraph.platform.cuda.kernels import linear_bf16_tl

    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3, 1, 96, generator=gen).to(torch.bfloat16).to(DEVICE)
    w, scale = _weight("fp8_block32", 64, 96, torch.bfloat16, gen)
    padded = torch.full((scale.numel() + 8,), 255, dtype=torch.uint8)
    padded[: scale.numel()] = scale.view(torch.uint8).flatten()
    boxed = padded.to(DEVICE)[: scale.numel()].view(scale.shape)
    out = torch.empty(3, 1, 64, device=DEVICE)
    tiles = cuda_linear.Tiles(16, 64, 128, 4, 3, True)  # weight scales read in the GEMM, per chunk
    linear_bf16_tl.launch(x, w.to(DEVICE), boxed, out, True, tiles, 1)
    p = _params("fp8_block32", "fp8_g32", "f32")
    xc = x[:, 0].cpu()
    xf, wf = rules_core.linear_operands(p, xc, w, scale)
    _check(
        p, out[:, 0], rules_core.linear(p, xc, w, scale), xf.abs() @ wf.abs().t(), _acc_tol(p, xc.dtype, w)
    )


# Every tile configuration the tables may pick, with the cases of its weight format.
FP8_TILES = sorted({t for _, t in cuda_linear.TILE_TABLE})
DENSE_TILES = sorted({t for _, t in cuda_linear.DENSE_TILE_TABLE})
# (weight_format, act_quant, x dtype, out_dtype, (M, N, K)): FP8 activations with K a multiple of every
# block_k and a partial N tile, then K = 160 (a partial K step for block_k > 32); wo_b's f32 activations;
# dense weights.
TILE_CASES = [
    ("fp8_block32", "fp8_g32", torch.bfloat16, "bf16", (5, 96, 256)),
    ("fp8_block32", "fp8_g32", torch.bfloat16, "f32", (3, 40, 160)),
    ("fp8_block32", "none", torch.float32, "f32", (5, 96, 256)),
    ("dense", "none", torch.bfloat16, "f32", (3, 40, 160)),
]


TILE_PAIRS = [(t, c) for c in TILE_CASES for t in (DENSE_TILES if c[0] == "dense" else FP8_TILES)]


@pytest.mark.parametrize(
    ("tiles", "case"), TILE_PAIRS, ids=lambda v: "-".join(map(str, v[:5])) if isinstance(v, tuple) and
    isinstance(v[0], int) else f"{v[0]}-{v[1]}-{str(v[2])[6:]}-{v[4]}"
)  # fmt: skip
def test_every_tile_config_matches_cpu_rule(tiles: cuda_linear.Tiles, case: tuple) -> None:
    weight_format, act_quant, x_dtype, out_dtype, (m, n, k) = case
    gen = torch.Generator().manual_seed(m + n + k)
    p = _params(weight_format, act_quant, out_dtype)
    x = (torch.randn(m, k, generator=gen) * 3).to(x_dtype)
    w = _weight(weight_format, n, k, x_dtype, gen)
    ref = rules_core.linear(p, x, *w)
    xf, wf = rules_core.linear_operands(p, x, *w)
    y = cuda_linear.linear(p, x.to(DEVICE), *(t.to(DEVICE) for t in w), tiles=tiles)
    _check(p, y, ref, xf.abs() @ wf.abs().t(), _acc_tol(p, x.dtype, w[0]))


def test_tiles_change_with_the_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule launches TILE_TABLE's entry for M (the rows, whatever the groups): decode, a mid batch
    and prefill get different tiles."""
    from dsgraph.platform.cuda.kernels import linear_bf16_tl

    for table in (cuda_linear.TILE_TABLE, cuda_linear.DENSE_TILE_TABLE):
        bounds = [b for b, _ in table]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), bounds
        assert all(tiles.block_k % 32 == 0 for _, tiles in table), table
    launched = []
    monkeypatch.setattr(linear_bf16_tl, "launch", lambda *args: launched.append(args[5]))
    gen = torch.Generator().manual_seed(4)
    w = _weight("fp8_block32", 2 * 32, 64, torch.bfloat16, gen)
    p = _params("fp8_block32", "fp8_g32", "f32")
    rows = (1, 16, 17, 256, 257, 4096)
    for m in rows:
        cuda_linear.linear(p, torch.zeros(m, 64, dtype=torch.bfloat16, device=DEVICE), *w)
        cuda_linear.grouped_linear(p, torch.zeros(m, 2, 64, dtype=torch.bfloat16, device=DEVICE), *w)
    assert launched == [cuda_linear.tiles_for(m) for m in rows for _ in range(2)]
    assert cuda_linear.tiles_for(1) != cuda_linear.tiles_for(64) != cuda_linear.tiles_for(4096)
    assert cuda_linear.tiles_for(1).swapped and not cuda_linear.tiles_for(4096).swapped
    assert cuda_linear.tiles_for(1) == cuda_linear.tiles_for(16) and cuda_linear.tiles_for(
        4096
    ) == cuda_linear.tiles_for(1 << 20)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tiles",
    [None, *sorted({t for _, t in cuda_linear.TILE_TABLE})],
    ids=lambda t: "table" if t is None else "-".join(map(str, t)),
)
@pytest.mark.parametrize(
    ("act_quant", "x_dtype", "nk"),
    [("fp8_g32", torch.bfloat16, (2304, 5120)), ("none", torch.float32, (5120, 8192))],
    ids=["fp8_g32-w1", "none-f32-wo_b"],
)
def test_rows_bit_equal_across_tiles_on_gpu(
    tiles: cuda_linear.Tiles | None, act_quant: str, x_dtype: torch.dtype, nk: tuple[int, int]
) -> None:
    """The same rows inside batches of 1, 8, 16, 17, 64, 65 and 300 rows (tiles None: the table's pick for
    each batch; else the given tiles) give the bits the prefill tiles give in a batch of 300. A failure
    here means a tensor-core step depends on the tile shape: that config cannot serve next to the others
    in one TILE_TABLE without breaking batch invariance."""
    gen = torch.Generator().manual_seed(21)
    x = (torch.randn(300, nk[1], generator=gen) * 2).to(x_dtype).to(DEVICE)
    w = tuple(t.to(DEVICE) for t in _weight("fp8_block32", *nk, torch.bfloat16, gen))
    p = _params("fp8_block32", act_quant, "bf16")
    full = cuda_linear.linear(p, x, *w, tiles=cuda_linear.TILE_TABLE[-1][1])
    for size in (1, 8, 16, 17, 64, 65, 300):
        for start in (0, 300 - size):
            part = cuda_linear.linear(p, x[start : start + size], *w, tiles=tiles)
            diff = (part != full[start : start + size]).sum().item()
            used = tiles or cuda_linear.tiles_for(size)
            assert diff == 0, f"batch {size} at row {start}, tiles {used}: {diff} elements differ"


def test_k_splits_depend_on_the_weight_shape_only() -> None:
    """Narrow decode projections are cut into K ranges (V4.1 widths), wide ones are not; every split is a
    multiple of SPLIT_ALIGN columns and at least MIN_SPLIT."""
    want = {(1, 2304, 5120): 4, (1, 512, 5120): 5, (1, 5120, 8192): 2, (1, 5120, 2304): 3,
            (8, 1024, 4096): 2, (1, 32768, 1280): 1, (1, 129280, 5120): 1, (1, 4096, 1280): 1}  # fmt: skip
    for (groups, n, k), splits in want.items():
        assert cuda_linear.k_splits(groups, n, k) == splits, (groups, n, k)
        assert (k // splits) % cuda_linear.SPLIT_ALIGN == 0 or splits == 1


def _split_case(case: tuple, rows: int, seed: int, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """(params, x [rows, 1024], weight) of a linear whose K = 1024 is cut into 4 ranges of 256 (the split
    constants scaled down to the tiny shapes; 256 is the largest BLOCK_K of the tile table), checked
    against the cpu rule's tolerance."""
    monkeypatch.setattr(cuda_linear, "SPLIT_ALIGN", 256)
    monkeypatch.setattr(cuda_linear, "MIN_SPLIT", 256)
    monkeypatch.setattr(cuda_linear, "SPLIT_TARGET", 1 << 30)
    weight_format, act_quant, x_dtype, out_dtype = case
    n, k = 96, 1024
    assert cuda_linear.k_splits(1, n, k) == 4
    gen = torch.Generator().manual_seed(seed)
    p = _params(weight_format, act_quant, out_dtype)
    x = (torch.randn(rows, k, generator=gen) * 3).to(x_dtype)
    w = _weight(weight_format, n, k, x_dtype, gen)
    _compare_linear(p, x, w)
    return p, x, w


@pytest.mark.parametrize(
    "case", [CASES[0], CASES[4], CASES[6]], ids=lambda c: f"{c[0]}-{c[1]}-{str(c[2])[6:]}-{c[3]}"
)
def test_split_k_matches_the_cpu_rule_and_keeps_rows_batch_invariant(
    case: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K in 4 ranges (_split_case): each row has the same bits alone and in batches that pick other
    tiles (1, 7, 70 rows)."""
    p, x, w = _split_case(case, 70, 17, monkeypatch)
    device_w = tuple(t.to(DEVICE) for t in w)
    full = cuda_linear.linear(p, x.to(DEVICE), *device_w)
    for size in (1, 7):
        part = cuda_linear.linear(p, x[3 : 3 + size].to(DEVICE), *device_w)
        assert torch.equal(part, full[3 : 3 + size]), size


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor (torch.equal counts -0 equal to +0)."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize(
    "case", [CASES[0], CASES[1], CASES[4]], ids=lambda c: f"{c[1]}-{str(c[2])[6:]}-{c[3]}"
)
@pytest.mark.parametrize("swapped", [False, True], ids=["plain", "swapped"])
def test_split_k_in_one_program_has_the_bits_of_a_program_per_range(
    case: tuple, swapped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split weight's K ranges summed one after the other in one program (the plain, prefill tiles'
    default) or by a program each whose partials the tile's last range adds (the swapped, decode tiles'
    default): the same tiles give the same bits either way, within the cpu rule's tolerance. On the GPU
    the plain tiles' rows also have the swapped tiles' bits (the same tensor-core steps)."""
    from dsgraph.platform.cuda.kernels import linear_bf16_tl

    p, x, w = _split_case(case, 20, 29, monkeypatch)
    act_quant, out_dtype, (n, k) = case[1], case[3], w[0].shape
    x3, (w8, scale) = x.reshape(20, 1, k).to(DEVICE), (t.to(DEVICE) for t in w)
    tiles = cuda_linear.tiles_for(1) if swapped else cuda_linear.TILE_TABLE[-1][1]
    assert tiles.swapped == swapped
    got = {}
    for in_program in (True, False):
        out = torch.empty((20, 1, n), dtype=to_torch(out_dtype), device=DEVICE)
        linear_bf16_tl.launch(
            x3, w8, scale.view(torch.uint8), out, act_quant == "fp8_g32", tiles, 4, in_program
        )
        got[in_program] = out.reshape(20, n)
    assert torch.equal(_bits(got[True]), _bits(got[False]))
    default = cuda_linear.linear(p, x.to(DEVICE), w8, scale, tiles=tiles)  # the rule's own choice
    assert torch.equal(_bits(got[not swapped]), _bits(default))
    if ON_GPU:
        other = cuda_linear.TILE_TABLE[-1][1] if swapped else cuda_linear.tiles_for(1)
        assert torch.equal(
            _bits(got[True]), _bits(cuda_linear.linear(p, x.to(DEVICE), w8, scale, tiles=other))
        )


def test_split_k_refuses_ranges_that_cut_a_k_step() -> None:
    from dsgraph.platform.cuda.kernels import linear_tl

    x = torch.zeros(1, 1, 320, device=DEVICE, dtype=torch.bfloat16)
    w = torch.zeros(32, 320, device=DEVICE, dtype=torch.bfloat16)
    out = torch.empty(1, 1, 32, device=DEVICE, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"2 K splits of K = 320, expected K a multiple of BLOCK_K \(128\)"):
        linear_tl.launch(x, w, None, out, linear_tl.DOT_NATIVE, (64, 32, 128, 4, 4), splits=2)


# (case, rows): decode tiles at 1 and 20 rows, the plain tiles at 300; FP8-g32 and f32 (split) inputs
# at one row (the interpreter is slow on their passes)
PAIR_CASES = [(CASES[3], 1), (CASES[3], 20), (CASES[3], 300), (CASES[0], 1), (CASES[1], 1)]


@pytest.mark.parametrize(
    ("case", "rows"), PAIR_CASES, ids=[f"{c[1]}-{str(c[2])[6:]}-rows{r}" for c, r in PAIR_CASES]
)
def test_a_pair_of_linears_has_the_bits_of_two_launches(
    case: tuple, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """linear_pair (two FP8 weights read by one x, ops/fused.py) in one launch: each output has the bits
    of its weight's own launch, for decode (swapped) and prefill (plain) tiles, split K (the second
    weight's columns in other programs of the same grid) and two widths (a partial last tile)."""
    p, x, w = _split_case(case, rows, 31, monkeypatch)
    gen = torch.Generator().manual_seed(32)
    w2 = _weight(case[0], 160, x.shape[1], x.dtype, gen)
    assert cuda_linear.k_splits(1, 160, x.shape[1]) == cuda_linear.k_splits(1, w[0].shape[0], x.shape[1])
    dev = [t.to(DEVICE) for t in (x, *w, *w2)]
    got = cuda_linear.linear_pair(p, *dev)
    want = (cuda_linear.linear(p, dev[0], *dev[1:3]), cuda_linear.linear(p, dev[0], *dev[3:5]))
    for g, ref in zip(got, want, strict=True):
        assert g.shape == ref.shape and torch.equal(_bits(g), _bits(ref))
    assert cuda_linear._one_launch(p, dev[0], dev[1], dev[3])


def test_a_pair_whose_splits_differ_runs_two_launches() -> None:
    """Weights whose K splits differ (a wide one is not split) keep a launch each: the same results."""
    gen = torch.Generator().manual_seed(33)
    p = _params("fp8_block32", "fp8_g32", "bf16")
    x = torch.randn(3, 5120, generator=gen).bfloat16()
    assert cuda_linear.k_splits(1, 2304, 5120) != cuda_linear.k_splits(1, 129280, 5120)
    small, wide = SimpleNamespace(shape=(2304, 5120)), SimpleNamespace(shape=(129280, 5120))
    assert not cuda_linear._one_launch(p, x.to(DEVICE), small, wide)
    w1, w2 = _weight("fp8_block32", 64, 64, x.dtype, gen), _weight("fp8_block32", 96, 64, x.dtype, gen)
    xs = x[:, :64].to(DEVICE)
    got = cuda_linear.linear_pair(p, xs, *(t.to(DEVICE) for t in (*w1, *w2)))
    assert torch.equal(got[0], cuda_linear.linear(p, xs, *(t.to(DEVICE) for t in w1)))
    assert torch.equal(got[1], cuda_linear.linear(p, xs, *(t.to(DEVICE) for t in w2)))


@pytest.mark.parametrize("rows", [1, 5, 64, 65])
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)]
)
def test_a_dense_pair_has_the_bits_of_two_launches(
    rows: int, x_dtype: torch.dtype, w_dtype: torch.dtype
) -> None:
    """dense_pair (a compressor's wkv and wgate read by one u) in one launch of the dense kernel: each
    output has the bits of its weight's own launch, with K split (K = 5120 at decode widths, in 5) and
    without, widths that leave a partial last tile; past PAIR_MAX_ROWS it runs the two launches."""
    gen = torch.Generator().manual_seed(41)
    p = _params("dense", "none", "f32")
    for k_size, n_size in ((5120, 48), (96, 40)):
        x = torch.randn(rows, k_size, generator=gen).to(x_dtype).to(DEVICE)
        w1, w2 = (
            (torch.randn(n_size, k_size, generator=gen) * 0.05).to(w_dtype).to(DEVICE) for _ in range(2)
        )
        got = cuda_linear.dense_pair(p, x, w1, w2)
        want = (cuda_linear.linear(p, x, w1), cuda_linear.linear(p, x, w2))
        for g, ref in zip(got, want, strict=True):
            assert g.shape == ref.shape and torch.equal(_bits(g), _bits(ref)), (k_size, rows)
