"""The cuda `rms_norm` and `rope` rules (kernels/norm_rope.py) against the cpu rules.

rms_norm: within the output dtype's tolerance (the sum of squares is added in another order), and
bit-equal when the sum of squares is exact (small dyadic values). rope: bit-equal on these samples (f64
cos/sin rounded to f32 vs the C library's cosf/sinf; they could differ in rare near-midpoint cases, so the
real-width test allows the f32/bf16 tolerance). Batch invariance: a row's result does not depend on the
rows around it. On a CUDA machine the kernels run on the GPU, elsewhere under Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.ops.nn import RMSNormParams  # noqa: E402
from dsgraph.ops.rope import RopeParams  # noqa: E402
from dsgraph.platform.cuda.kernels import norm_rope  # noqa: E402
from tests.cuda.kernel_env import compare_rules, on_device  # noqa: E402

NORM = RMSNormParams(eps=1e-6)
YARN = dict(theta=10000.0, yarn_factor=16.0, beta_fast=32.0, beta_slow=1.0, original_max=65536)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(("dtype", "shape"), [(torch.bfloat16, (3, 96)), (torch.float32, (2, 3, 40))])
def test_rms_norm_matches(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = (torch.randn(*shape, generator=_gen(1)) * 3).to(dtype)
    w = torch.rand(shape[-1], generator=_gen(2)) + 0.5
    compare_rules("rms_norm", NORM, [x, w.to(dtype)])


def test_rms_norm_is_bit_equal_on_exact_sums() -> None:
    x = (torch.randint(-8, 9, (4, 1100), generator=_gen(3)).float() / 8).to(torch.bfloat16)
    w = torch.rand(1100, generator=_gen(4)).to(torch.bfloat16)
    compare_rules("rms_norm", NORM, [x, w], tol=(0.0, 0.0))


def test_rms_norm_is_batch_invariant() -> None:
    x, w = on_device([torch.randn(6, 200, generator=_gen(5)).to(torch.bfloat16), torch.rand(200)])
    assert torch.equal(norm_rope.rms_norm(NORM, x, w)[4:5].cpu(), norm_rope.rms_norm(NORM, x[4:5], w).cpu())


def _rope_f64_trig(p: RopeParams, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The cpu rule with cos/sin correctly rounded from f64 instead of the C library's cosf/sinf."""
    from dsgraph.platform.cpu import invariant
    from dsgraph.platform.cpu.rules_rope import rope_frequencies

    angles = (positions.float().unsqueeze(-1) * rope_frequencies(p)).unsqueeze(1).double()
    cos, sin = angles.cos().float(), angles.sin().float() * (-1 if p.inverse else 1)
    pairs = x[..., -p.rope_dim :].float().unflatten(-1, (-1, 2))
    real, imag = invariant.rotate_pairs(pairs[..., 0], pairs[..., 1], cos, sin)
    rotated = torch.stack((real, imag), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat((x[..., : -p.rope_dim], rotated), dim=-1)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_with_heads(inverse: bool, dtype: torch.dtype) -> None:
    """Within tolerance of the cpu rule; bit-equal to its arithmetic with correctly rounded cos/sin."""
    p = RopeParams(rope_dim=16, inverse=inverse, **YARN)
    x = torch.randn(3, 5, 40, generator=_gen(6)).to(dtype)
    positions = torch.tensor([0, 17, 70000], dtype=torch.int32)
    got, _ = compare_rules("rope", p, [x, positions])
    assert torch.equal(got[0].cpu(), _rope_f64_trig(p, x, positions))


def test_rope_without_heads_and_without_yarn() -> None:
    p = RopeParams(rope_dim=8, theta=160000.0)
    x = torch.randn(4, 8, generator=_gen(7)).to(torch.bfloat16)
    compare_rules("rope", p, [x, torch.tensor([3, 4, 5, 1000], dtype=torch.int32)], tol=(0.0, 0.0))


def test_rope_is_batch_invariant() -> None:
    p = RopeParams(rope_dim=16, **YARN)
    x, pos = on_device([torch.randn(5, 3, 32, generator=_gen(8)), torch.arange(5, dtype=torch.int32) * 999])
    assert torch.equal(norm_rope.rope(p, x, pos)[2:3].cpu(), norm_rope.rope(p, x[2:3], pos[2:3]).cpu())


@pytest.mark.gpu
def test_norm_rope_at_real_width() -> None:
    """hidden 5120, head 512 with rope 64, 64 heads, positions up to 1M."""
    x = torch.randn(8, 5120, generator=_gen(9)).to(torch.bfloat16)
    compare_rules("rms_norm", NORM, [x, torch.rand(5120, generator=_gen(10)).to(torch.bfloat16)])
    q = torch.randn(8, 64, 512, generator=_gen(11)).to(torch.bfloat16)
    positions = torch.randint(0, 1 << 20, (8,), generator=_gen(12), dtype=torch.int32)
    compare_rules("rope", RopeParams(rope_dim=64, **YARN), [q, positions])
