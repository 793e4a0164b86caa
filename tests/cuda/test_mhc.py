"""The cuda `hc_pre`, `hc_collapse` and `hc_expand` rules (kernels/mhc.py) against the cpu rules.

hc_collapse and hc_expand must be bit-equal. hc_pre is bit-equal when its projections are exactly
representable (small dyadic x and fn: every order of summation gives the same f32), which isolates the
Sinkhorn and coefficient arithmetic; on random data it agrees within f32 tolerance (the projection's sum
order differs). Batch invariance: a row's results do not change with the other rows of the call.
On a CUDA machine the kernels run on the GPU, elsewhere under Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.ops.mhc import HcCollapseParams, HcPreParams  # noqa: E402
from dsgraph.platform.cuda.kernels import mhc  # noqa: E402
from tests.cuda.kernel_env import compare_rules, on_device  # noqa: E402

PRE = HcPreParams(sinkhorn_iters=20, eps=1e-6, norm_eps=1e-6)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _dyadic(shape: tuple[int, ...], levels: int, step: float, seed: int) -> torch.Tensor:
    """Integers in [-levels, levels] times `step` (a power of two): sums of products are exact in f32."""
    return torch.randint(-levels, levels + 1, shape, generator=_gen(seed)).float() * step


def _pre_args(tokens: int, n: int, hidden: int, exact: bool, seed: int) -> list[torch.Tensor]:
    mixes = 2 * n + n * n
    if exact:
        x = _dyadic((tokens, n, hidden), 8, 2.0**-3, seed).to(torch.bfloat16)
        fn = _dyadic((mixes, n * hidden), 8, 2.0**-6, seed + 1)
    else:
        x = torch.randn(tokens, n, hidden, generator=_gen(seed)).to(torch.bfloat16)
        fn = torch.randn(mixes, n * hidden, generator=_gen(seed + 1)) * 0.05
    base = torch.randn(mixes, generator=_gen(seed + 2))
    scale = torch.tensor([0.7, 1.3, 2.1])
    return [x, fn, base, scale]


@pytest.mark.parametrize(("n", "hidden"), [(4, 64), (3, 64), (4, 640)])
def test_hc_pre_is_bit_equal_on_exact_projections(n: int, hidden: int) -> None:
    """(4, 640): n*H = 2560 spans three of the kernel's 1024-column slices, the last one partial."""
    compare_rules("hc_pre", PRE, _pre_args(3, n, hidden, exact=True, seed=n), tol=(0.0, 0.0))


def test_hc_pre_matches_on_random_rows() -> None:
    got, want = compare_rules("hc_pre", PRE, _pre_args(4, 4, 640, exact=False, seed=7))
    comb = got[2].cpu()
    assert torch.allclose(comb.sum(-2), torch.ones(4, 4), atol=1e-3), "columns of comb must sum to ~1"


def test_hc_pre_is_batch_invariant() -> None:
    args = on_device(_pre_args(5, 4, 64, exact=False, seed=11))
    full = mhc.hc_pre(PRE, *args)
    alone = mhc.hc_pre(PRE, args[0][2:3], *args[1:])
    for got, one in zip(full, alone, strict=True):
        assert torch.equal(got[2:3].cpu(), one.cpu())


@pytest.mark.parametrize("out_dtype", ["f32", "bf16"])
def test_hc_collapse_is_bit_equal(out_dtype: str) -> None:
    x = torch.randn(3, 4, 80, generator=_gen(1)).to(torch.bfloat16)
    a = torch.rand(3, 4, generator=_gen(2))
    compare_rules("hc_collapse", HcCollapseParams(out_dtype=out_dtype), [x, a], tol=(0.0, 0.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hc_expand_is_bit_equal(dtype: torch.dtype) -> None:
    y = torch.randn(3, 80, generator=_gen(3)).to(torch.bfloat16)
    x = torch.randn(3, 4, 80, generator=_gen(4)).to(dtype)
    post = 2 * torch.rand(3, 4, generator=_gen(5))
    comb = torch.rand(3, 4, 4, generator=_gen(6))
    compare_rules("hc_expand", None, [y, x, post, comb], tol=(0.0, 0.0))


@pytest.mark.gpu
def test_mhc_at_real_width() -> None:
    """hidden 5120, hc_mult 4: the decode shapes."""
    compare_rules("hc_pre", PRE, _pre_args(8, 4, 5120, exact=False, seed=21))
    compare_rules("hc_pre", PRE, _pre_args(8, 4, 5120, exact=True, seed=22), tol=(0.0, 0.0))
    x = torch.randn(8, 4, 5120, generator=_gen(23)).to(torch.bfloat16)
    a = torch.rand(8, 4, generator=_gen(24))
    compare_rules("hc_collapse", HcCollapseParams(out_dtype="bf16"), [x, a], tol=(0.0, 0.0))
    y = torch.randn(8, 5120, generator=_gen(25)).to(torch.bfloat16)
    comb = torch.rand(8, 4, 4, generator=_gen(26))
    compare_rules("hc_expand", None, [y, x, a, comb], tol=(0.0, 0.0))
