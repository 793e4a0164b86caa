"""The cuda `add_f32` rule (kernels/elementwise.py) against the cpu rule: bit-equal for every pair of float
dtypes and out_dtype, with NaN, infinities, -0 and sums that round at the output's precision. On a CUDA
machine the kernel runs on the GPU, elsewhere under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.ops.core import AddF32Params  # noqa: E402
from dsgraph.platform.cpu import rules_core  # noqa: E402
from dsgraph.platform.cuda.kernels import elementwise  # noqa: E402
from tests.cuda.kernel_env import on_device  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _operands(a_dtype: torch.dtype, b_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(3, 1100, generator=gen) * 40  # 1,100 columns: a partial last block of the kernel
    b = torch.randn(3, 1100, generator=gen) * 1e-3  # small: many sums round at bf16/f16 precision
    a[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    b[0, 4:8] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    a[1, 0], b[1, 0] = float("inf"), -float("inf")  # inf - inf = NaN
    return a.to(a_dtype), b.to(b_dtype)


@pytest.mark.parametrize("a_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("out_dtype", ["f32", "bf16", "f16"])
def test_add_f32_is_bit_equal_to_the_cpu_rule(
    a_dtype: torch.dtype, b_dtype: torch.dtype, out_dtype: str
) -> None:
    p = AddF32Params(out_dtype=out_dtype)
    a, b = _operands(a_dtype, b_dtype)
    want = rules_core.add_f32(p, a, b)
    got = elementwise.add_f32(p, *on_device([a, b])).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
    bits = {2: torch.int16, 4: torch.int32}[want.element_size()]
    keep = ~want.isnan()
    assert torch.equal(got[keep].view(bits), want[keep].view(bits))


def test_add_f32_broadcasts_and_keeps_empty_shapes() -> None:
    p = AddF32Params(out_dtype="bf16")
    a = torch.randn(4, 1, 64)
    b = torch.randn(1, 5, 64).to(torch.bfloat16)
    got = elementwise.add_f32(p, *on_device([a, b])).cpu()
    assert got.shape == (4, 5, 64) and torch.equal(got, rules_core.add_f32(p, a, b))
    empty = elementwise.add_f32(p, *on_device([torch.empty(0, 8), torch.empty(0, 8)]))
    assert empty.shape == (0, 8) and empty.dtype == torch.bfloat16
