"""The cuda rules of the fused ops (ops/fused.py) give the bits of the two cuda rules they fuse:
- `<op>_qdq` (rms_norm, rope, swiglu, hc_collapse_norm, rms_norm_rope): one kernel that quantizes what
  it computed, for every quantization format, both output dtypes, with and without the raw output, and
  on non-finite values; shapes the kernel does not quantize apart fall back to the two launches;
- `hc_expand_pre` (hc_pre's kernel computing the streams as hc_expand's does), `hc_collapse_norm`
  (the norm's kernel collapsing the streams as it reads them) and `rms_norm_rope` (one program per row
  normalizing, then rotating its rope columns).
On a CUDA machine the kernels run on the GPU, elsewhere under Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.graph.op import NoParams  # noqa: E402
from dsgraph.ops.fused import (  # noqa: E402
    HcCollapseNormParams,
    HcCollapseNormQdqParams,
    RMSNormQdqParams,
    RMSNormRopeParams,
    RMSNormRopeQdqParams,
    RopeQdqParams,
    SwigluQdqParams,
    inner_params,
    rope_params,
)
from dsgraph.ops.mhc import HcCollapseParams, HcPreParams  # noqa: E402
from dsgraph.ops.nn import RMSNormParams  # noqa: E402
from dsgraph.ops.quant import ActQdqParams  # noqa: E402
from dsgraph.platform.cuda.kernels import mhc, moe, norm_rope, quant_act  # noqa: E402
from tests.cuda.kernel_env import DEVICE, as_tuple, compare_rules, on_device  # noqa: E402

FORMATS = ("fp8_g32", "mxfp4_g32", "nvfp4_g16_recip")
YARN = dict(theta=10000.0, yarn_factor=16.0, beta_fast=32.0, beta_slow=1.0, original_max=65536)
N, H = 4, 160  # streams and hidden width of the mHC cases


def _collapse_then_norm(p, x, a, w):  # type: ignore[no-untyped-def]
    row = mhc.hc_collapse(HcCollapseParams(out_dtype=p.out_dtype), x, a)
    return norm_rope.rms_norm(RMSNormParams(eps=p.eps), row, w)


def _norm_then_rope(p, x, w, positions):  # type: ignore[no-untyped-def]
    return norm_rope.rope(rope_params(p), norm_rope.rms_norm(RMSNormParams(eps=p.eps), x, w), positions)


PRODUCERS = {
    "rms_norm_qdq": norm_rope.rms_norm,
    "rope_qdq": norm_rope.rope,
    "swiglu_qdq": moe.swiglu,
    "hc_collapse_norm_qdq": _collapse_then_norm,
    "rms_norm_rope_qdq": _norm_then_rope,
}
FUSED = {
    "rms_norm_qdq": norm_rope.rms_norm_qdq,
    "rope_qdq": norm_rope.rope_qdq,
    "swiglu_qdq": moe.swiglu_qdq,
    "hc_collapse_norm_qdq": norm_rope.hc_collapse_norm_qdq,
    "rms_norm_rope_qdq": norm_rope.rms_norm_rope_qdq,
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _specials(x: torch.Tensor) -> torch.Tensor:
    """x with a NaN, infinities and a -0 in its first row (each in a group of its own)."""
    x = x.clone()
    flat = x.reshape(-1)
    for i, v in zip((3, 40, 77, 130), (float("nan"), float("inf"), -float("inf"), -0.0), strict=False):
        if i < flat.numel():
            flat[i] = v
    return x


def _two_launches(op: str, p, args: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    y = PRODUCERS[op](inner_params(p), *args)
    q = quant_act.act_qdq(ActQdqParams(fmt=p.qdq_fmt, out_dtype=p.qdq_dtype), y)
    return (y, q) if p.raw else (q,)


def _same_bits(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} results, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, (
            f"{what} result {i}: {g.dtype} {g.shape} vs {w.dtype}"
        )
        g, w = g.cpu().float(), w.cpu().float()
        same = (g == w) | (g.isnan() & w.isnan())
        assert bool(same.all()), f"{what} result {i}: differs at {(~same).nonzero()[0].tolist()}"


def _cases() -> list[tuple[str, object, list[torch.Tensor]]]:
    x = torch.randn(3, 5, 96, generator=_gen(1)) * 3
    norm_x, norm_w = (torch.randn(4, 1088, generator=_gen(2)) * 2).to(torch.bfloat16), torch.rand(1088) + 0.5
    g, v = torch.randn(3, 160, generator=_gen(3)) * 4, torch.randn(3, 160, generator=_gen(4)) * 4
    positions = torch.tensor([0, 17, 70000], dtype=torch.int32)
    streams, mix = (
        torch.randn(3, N, H, generator=_gen(5)).bfloat16(),
        torch.rand(3, N, generator=_gen(6)) + 0.2,
    )
    cases = []
    for fmt in FORMATS:
        for dtype in ("bf16", "same"):
            for raw in (True, False):
                q = dict(qdq_fmt=fmt, qdq_dtype=dtype, raw=raw)
                cases.append(("rms_norm_qdq", RMSNormQdqParams(eps=1e-6, **q), [norm_x, norm_w.bfloat16()]))
                cases.append(
                    (
                        "rope_qdq",
                        RopeQdqParams(rope_dim=32, inverse=raw, **YARN, **q),
                        [x.bfloat16(), positions],
                    )
                )
                cases.append(
                    ("swiglu_qdq", SwigluQdqParams(limit=7.0, out_dtype="f32", **q), [g, v.bfloat16()])
                )
                p = HcCollapseNormQdqParams(eps=1e-6, out_dtype="bf16", **q)
                cases.append(("hc_collapse_norm_qdq", p, [streams, mix, torch.rand(H).bfloat16() + 0.5]))
                p = RMSNormRopeQdqParams(rope_dim=32, inverse=not raw, eps=1e-6, **YARN, **q)
                cases.append(
                    ("rms_norm_rope_qdq", p, [x.bfloat16(), torch.rand(96).bfloat16() + 0.5, positions])
                )
    return cases


@pytest.mark.parametrize(("op", "p", "args"), _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_fused_is_the_two_launches(op: str, p, args: list[torch.Tensor]) -> None:
    args = on_device(args)
    _same_bits(as_tuple(FUSED[op](p, *args)), _two_launches(op, p, args), f"{op} {p}")


@pytest.mark.parametrize("op", sorted(FUSED))
def test_non_finite_values(op: str) -> None:
    for name, p, args in _cases():
        if name == op and p.qdq_fmt == "fp8_g32":
            args = on_device([_specials(args[0]), *args[1:]])
            _same_bits(as_tuple(FUSED[op](p, *args)), _two_launches(op, p, args), f"{op} {p}")


def test_fused_matches_the_cpu_rules() -> None:
    """Against the cpu meaning (producer then act_qdq): rms_norm sums its squares in another order
    (compare_rules' tolerance), the others give the same values here."""
    for op, p, args in _cases():
        if p.qdq_dtype == "bf16":
            compare_rules(op, p, args)


def test_fused_rope_without_passed_through_columns_and_a_wide_rope() -> None:
    """A head that is all rope columns (no pass-through part), and a rope of 64 columns (two groups)."""
    positions = torch.tensor([5, 999], dtype=torch.int32)
    for width, rope_dim in ((32, 32), (128, 64)):
        x = on_device([torch.randn(2, 4, width, generator=_gen(width)).bfloat16(), positions])
        p = RopeQdqParams(rope_dim=rope_dim, theta=160000.0, qdq_fmt="fp8_g32", qdq_dtype="bf16", raw=True)
        _same_bits(
            as_tuple(norm_rope.rope_qdq(p, *x)), _two_launches("rope_qdq", p, x), f"{width}/{rope_dim}"
        )


def test_shapes_the_kernel_does_not_split_fall_back_to_two_launches() -> None:
    """rope 16 of 64 columns: the passed-through run (48) and the rotated one (16) are not multiples of
    the fp8 group (32), which spans both; the rule runs the rope kernel, then act_qdq's."""
    x = on_device(
        [torch.randn(2, 3, 64, generator=_gen(9)).bfloat16(), torch.tensor([1, 2], dtype=torch.int32)]
    )
    p = RopeQdqParams(rope_dim=16, theta=10000.0, qdq_fmt="fp8_g32", qdq_dtype="bf16", raw=False)
    assert quant_act.epilogue(p, tuple(x[0].shape), x[0].dtype, x[0].device, 48, 16) is None
    _same_bits(as_tuple(norm_rope.rope_qdq(p, *x)), _two_launches("rope_qdq", p, x), "rope 16 of 64")


def _mhc_operands(tokens: int, n: int, hidden: int, seed: int) -> dict[str, torch.Tensor]:
    """The mHC ops' operands (streams, coefficients, hc_pre's weights, a norm weight) on the device."""
    gen = _gen(seed)
    comb = torch.rand(tokens, n, n, generator=gen)
    operands = dict(
        y=torch.randn(tokens, hidden, generator=gen).bfloat16(),
        x=torch.randn(tokens, n, hidden, generator=gen).bfloat16(),
        post=torch.rand(tokens, n, generator=gen) * 2,
        comb=comb / comb.sum(1, keepdim=True),
        fn=torch.randn(2 * n + n * n, n * hidden, generator=gen) * 0.05,
        base=torch.randn(2 * n + n * n, generator=gen) * 0.1,
        scale=torch.tensor([0.5, 0.7, 0.9]),
        w=torch.rand(hidden, generator=gen).bfloat16() + 0.5,
        a=torch.rand(tokens, n, generator=gen) + 0.2,
    )
    return {k: v.to(DEVICE) for k, v in operands.items()}


def _expand_pre_against_two_launches(tokens: int, n: int, hidden: int, seed: int) -> None:
    o = _mhc_operands(tokens, n, hidden, seed)
    p = HcPreParams(sinkhorn_iters=20, eps=1e-6, norm_eps=1e-6)
    got = mhc.hc_expand_pre(p, o["y"], o["x"], o["post"], o["comb"], o["fn"], o["base"], o["scale"])
    streams = mhc.hc_expand(NoParams(), o["y"], o["x"], o["post"], o["comb"])
    want = (streams, *mhc.hc_pre(p, streams, o["fn"], o["base"], o["scale"]))
    _same_bits(got, want, f"hc_expand_pre {tokens}x{n}x{hidden}")


def test_expand_pre_is_expand_then_pre() -> None:
    """Slices of hc_pre (1024 columns) inside one stream (H 2048) and across streams (H 640)."""
    _expand_pre_against_two_launches(3, 2, 2048, 20)
    _expand_pre_against_two_launches(2, 4, 640, 21)


def test_collapse_norm_is_collapse_then_norm() -> None:
    o = _mhc_operands(3, N, 1100, 22)
    for dtype in ("bf16", "f32"):
        p = HcCollapseNormParams(eps=1e-6, out_dtype=dtype)
        got = norm_rope.hc_collapse_norm(p, o["x"], o["a"], o["w"])
        _same_bits((got,), (_collapse_then_norm(p, o["x"], o["a"], o["w"]),), f"hc_collapse_norm {dtype}")
        compare_rules("hc_collapse_norm", p, [o["x"], o["a"], o["w"]])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_norm_rope_is_norm_then_rope(dtype: torch.dtype) -> None:
    """rms_norm_rope in one launch: the norm's and the rope's bits (token rows, and heads of a token
    sharing its position; a head that is all rope columns), and the cpu rules' values within theirs."""
    positions = torch.tensor([0, 17, 70000], dtype=torch.int32)
    for shape, rope_dim in (((3, 96), 32), ((3, 4, 96), 32), ((3, 2, 64), 64)):
        gen = _gen(sum(shape))
        args = [(torch.randn(shape, generator=gen) * 3).to(dtype), torch.rand(shape[-1], generator=gen) + 0.5]
        for inverse in (False, True):
            p = RMSNormRopeParams(rope_dim=rope_dim, inverse=inverse, eps=1e-6, **YARN)
            dev = on_device([*args, positions])
            _same_bits((norm_rope.rms_norm_rope(p, *dev),), (_norm_then_rope(p, *dev),), f"{shape} {p}")
            compare_rules("rms_norm_rope", p, [*args, positions])


@pytest.mark.gpu
def test_fused_at_real_width() -> None:
    """hidden 5120 (norm), 64 heads of 512 with rope 64 (q) and the single kv head, the shared expert's
    2048 columns, at 8 rows."""
    q = dict(qdq_fmt="fp8_g32", qdq_dtype="bf16")
    positions = torch.randint(0, 1 << 20, (8,), generator=_gen(12), dtype=torch.int32)
    cases = [
        ("rms_norm_qdq", RMSNormQdqParams(eps=1e-6, raw=True, **q),
         [torch.randn(8, 5120).bfloat16(), torch.rand(5120).bfloat16()]),
        ("rope_qdq", RopeQdqParams(rope_dim=64, inverse=True, raw=False, **YARN, **q),
         [torch.randn(8, 64, 512).bfloat16(), positions]),
        ("rope_qdq", RopeQdqParams(rope_dim=64, raw=False, **YARN, qdq_fmt="fp8_g32"),
         [torch.randn(8, 512).bfloat16(), positions]),
        ("swiglu_qdq", SwigluQdqParams(limit=10.0, out_dtype="f32", raw=False, **q),
         [torch.randn(8, 2048) * 4, torch.randn(8, 2048).bfloat16() * 4]),
        ("rms_norm_rope_qdq", RMSNormRopeQdqParams(rope_dim=64, eps=1e-6, raw=True, **YARN, **q),
         [torch.randn(8, 512).bfloat16(), torch.rand(512).bfloat16(), positions]),
    ]  # fmt: skip
    for op, p, args in cases:
        args = on_device(args)
        _same_bits(as_tuple(FUSED[op](p, *args)), _two_launches(op, p, args), f"{op} {p}")
    _expand_pre_against_two_launches(8, 4, 5120, 30)
    o = _mhc_operands(8, 4, 5120, 31)
    p = HcCollapseNormQdqParams(eps=1e-6, out_dtype="bf16", raw=True, **q)
    got = norm_rope.hc_collapse_norm_qdq(p, o["x"], o["a"], o["w"])
    _same_bits(got, _two_launches("hc_collapse_norm_qdq", p, [o["x"], o["a"], o["w"]]), "collapse norm 5120")
