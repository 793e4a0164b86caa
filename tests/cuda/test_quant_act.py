"""The cuda `act_qdq` and `cache_encode` rules (kernels/quant_act.py) against the cpu codecs: bit-equal
for every format, on values spread over many binades, with exact E2M1 midpoints, zeros, -0 and groups
whose amax is below the scale floors. Batch invariance: a row's bytes do not depend on the other rows.
On a CUDA machine the kernels run on the GPU, elsewhere under Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.ops.quant import FORMATS, ActQdqParams, QdqParams  # noqa: E402
from dsgraph.platform.cuda.kernels import quant_act  # noqa: E402
from tests.cuda.kernel_env import compare_rules, on_device  # noqa: E402


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _values(rows: int, width: int, seed: int) -> torch.Tensor:
    """Random magnitudes over 2^-12 .. 2^8, one row of E2M1 midpoints x 2^k (ties), a row with zeros and
    -0, and a row of tiny values (amax under every floor)."""
    x = torch.randn(rows, width, generator=_gen(seed)) * torch.exp2(
        torch.randint(-12, 9, (rows, 1), generator=_gen(seed + 1)).float()
    )
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]).repeat(width // 8)
    x[0] = ties * torch.where(torch.arange(width) % 3 == 0, -1.0, 1.0)
    x[1, ::2] = 0.0
    x[1, 1::4] = -0.0
    x[2] = x[2] * 1e-9
    return x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", ["same", "bf16"])
def test_act_qdq_is_bit_equal(fmt: str, dtype: torch.dtype, out_dtype: str) -> None:
    p = ActQdqParams(fmt=fmt, out_dtype=out_dtype)
    got, _ = compare_rules("act_qdq", p, [_values(6, 64, seed=1).to(dtype)], tol=(0.0, 0.0))
    assert got[0].dtype == (dtype if out_dtype == "same" else torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_qdq_in_bf16_is_the_linears_own_qdq(dtype: torch.dtype) -> None:
    """The op a linear's input is quantized by (models/deepseek_v41/context.py `act_quantize`) gives the
    bits of the pass a linear with act_quant fp8_g32 runs itself (linear_bf16_tl.qdq_rows), and the f32
    values of the cpu codec exactly (FP8 values times power-of-two scales are exact in bf16)."""
    from dsgraph.platform.cpu.quant import fp8_g32_qdq
    from dsgraph.platform.cuda.kernels.linear_bf16_tl import qdq_rows

    (x,) = on_device([_values(6, 64, seed=6).to(dtype)])
    shared = quant_act.act_qdq(ActQdqParams(fmt="fp8_g32", out_dtype="bf16"), x)
    own = qdq_rows(x.reshape(6, 1, 64).contiguous()).reshape(6, 64)
    assert torch.equal(shared.view(torch.int16).cpu(), own.view(torch.int16).cpu())
    assert torch.equal(shared.float().cpu(), fp8_g32_qdq(x.float().cpu()))


@pytest.mark.parametrize("fmt", FORMATS)
def test_cache_encode_is_bit_equal(fmt: str) -> None:
    x = _values(6, 96, seed=2).to(torch.bfloat16).unflatten(0, (2, 3))  # [2, 3, 96]: leading dims kept
    compare_rules("cache_encode", QdqParams(fmt=fmt), [x])
    compare_rules("cache_encode", QdqParams(fmt=fmt), [_values(5, 64, seed=3)])


def _non_finite_groups() -> torch.Tensor:
    """Rows of 64 (two FP8-g32 groups) holding NaN, +-inf, both, and zeros beside them."""
    x = _values(4, 64, seed=7)
    x[0, 3], x[0, 40] = float("nan"), 0.0
    x[1, 33] = float("inf")
    x[2, 0], x[2, 1], x[2, 2] = -float("inf"), -0.0, float("nan")
    x[3, 32:] = float("nan")
    return x


def _same_up_to_nan_sign(got: torch.Tensor, want: torch.Tensor) -> None:
    """The same values bit for bit (-0 apart from +0), where a NaN only has to be a NaN: its sign bit is
    the platform's (x86 division makes -NaN)."""
    got, want = got.cpu().float(), want.cpu().float()
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(got[keep].view(torch.int32), want[keep].view(torch.int32))


def test_fp8_g32_of_non_finite_groups_is_the_cpu_codecs() -> None:
    """act_qdq and cache_encode in FP8-g32 run quant_tl's codec: a group holding a NaN or an infinity
    comes out as the cpu codec's (NaN, zeros and +-448 times its -0 or +inf scale), not finite."""
    from dsgraph.platform.cpu.target import PLATFORM as CPU

    x = _non_finite_groups()
    (dev,) = on_device([x])
    act = ActQdqParams(fmt="fp8_g32", out_dtype="same")
    want = CPU.rules["act_qdq"](act, x)
    assert want.isnan().any() and want.isfinite().any()
    _same_up_to_nan_sign(quant_act.act_qdq(act, dev), want)
    enc = QdqParams(fmt="fp8_g32")
    got_entries, want_entries = quant_act.cache_encode(enc, dev).cpu(), CPU.rules["cache_encode"](enc, x)
    fp8 = torch.float8_e4m3fn
    _same_up_to_nan_sign(
        got_entries[:, :64].contiguous().view(fp8), want_entries[:, :64].contiguous().view(fp8)
    )
    assert torch.equal(got_entries[:, 64:], want_entries[:, 64:])  # the scale bytes, 0 and 255 included
    assert {0, 255} <= set(want_entries[:, 64:].flatten().tolist())


def test_rows_are_batch_invariant() -> None:
    (x,) = on_device([_values(5, 64, seed=4)])
    for fmt in FORMATS:
        p, q = QdqParams(fmt=fmt), ActQdqParams(fmt=fmt)
        assert torch.equal(quant_act.cache_encode(p, x)[3:4].cpu(), quant_act.cache_encode(p, x[3:4]).cpu())
        assert torch.equal(quant_act.act_qdq(q, x)[3:4].cpu(), quant_act.act_qdq(q, x[3:4]).cpu())


@pytest.mark.gpu
def test_quant_at_real_width() -> None:
    """SWA KV 512 (fp8), compressed KV 512 (nvfp4), index 128 (mxfp4), over 64 rows."""
    for fmt, width in (("fp8_g32", 512), ("nvfp4_g16_recip", 512), ("nvfp4_g16", 512), ("mxfp4_g32", 128)):
        x = _values(64, width, seed=5).to(torch.bfloat16)
        compare_rules("act_qdq", ActQdqParams(fmt=fmt), [x], tol=(0.0, 0.0))
        compare_rules("cache_encode", QdqParams(fmt=fmt), [x])
