"""Group A1 ops (act_qdq, cache codecs, linear, grouped_linear, rope, mHC): shape rules, hand-checked values.

Expected values here come from hand arithmetic or from small float64 re-derivations of the spec
formulas, never from the rules under test. tests/oracle/test_ops_a1_vs_nemo.py compares with NeMo.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import dsgraph.ops  # noqa: F401
from dsgraph.graph import TensorType as TT
from dsgraph.graph import make_graph
from dsgraph.graph.op import ShapeError
from dsgraph.ops import op
from dsgraph.ops.quant import entry_bytes
from dsgraph.ops.rope import yarn_bounds
from dsgraph.platform.cpu.interpret import run_graph


def run(fn: Any, types: list[TT], args: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return run_graph(make_graph(fn, *types), args)


def out(fn: Any, types: list[TT], args: list[torch.Tensor]) -> torch.Tensor:
    return run(fn, types, args)["out"]


# ---- shape rules: each names the offending operand or param ----

F32 = "f32"
SHAPE_ERRORS = [
    (lambda x: op.act_qdq(x, fmt="fp8_g32"), [TT((2, 32), "i32")], "x must have dtype"),
    (lambda x: op.act_qdq(x, fmt="fp8_g32"), [TT((2, 48), F32)], "last dim of x .* multiple of 32"),
    (lambda x: op.act_qdq(x, fmt="int4"), [TT((2, 32), F32)], "fmt 'int4' is not one of"),
    (lambda x: op.cache_encode(x, fmt="nvfp4_g16"), [TT((2, 40), F32)], "last dim of x .* multiple of 16"),
    (lambda e: op.cache_decode(e, fmt="fp8_g32", width=64), [TT((2, 64), "u8")], "entry bytes of entries"),
    (lambda e: op.cache_decode(e, fmt="fp8_g32", width=64), [TT((2, 66), "i8")], "entries must have dtype"),
    (lambda e: op.cache_decode(e, fmt="mxfp4_g32", width=40), [TT((2, 20), "u8")], "param width is 40"),
    (lambda e: op.cache_decode(e, fmt="fp8_g32", width=32, dtype="i32"), [TT((2, 33), "u8")], "param dtype"),
    (
        lambda x, w: op.linear(x, w, weight_format="fp8_block32"),
        [TT((2, 64), F32), TT((8, 64), "f8e4m3")],
        "fp8_block32 takes 3 operands",
    ),
    (
        lambda x, w, s: op.linear(x, w, s, weight_format="fp8_block32"),
        [TT((2, 64), F32), TT((40, 64), "f8e4m3"), TT((1, 2), "e8m0")],
        r"scale .* expected shape \(2, 2\)",
    ),
    (
        lambda x, w, s: op.linear(x, w, s, weight_format="fp8_block32"),
        [TT((2, 64), F32), TT((32, 64), "bf16"), TT((1, 2), "e8m0")],
        "weight must have dtype",
    ),
    (
        lambda x, w, s: op.linear(x, w, s, weight_format="fp8_block32"),
        [TT((2, 64), F32), TT((32, 64), "f8e4m3"), TT((1, 2), "u8")],
        "scale must have dtype",
    ),
    (lambda x, w: op.linear(x, w), [TT((2, 64), F32), TT((8, 32), F32)], "in-features of x"),
    (lambda x, w: op.linear(x, w), [TT((2, 64), "i32"), TT((8, 64), F32)], "x must be a float"),
    (
        lambda x, w: op.linear(x, w, act_quant="fp8_g32"),
        [TT((2, 48), F32), TT((8, 48), F32)],
        "multiple of 32",
    ),
    (
        lambda x, w: op.linear(x, w, weight_format="mxfp4"),
        [TT((2, 64), F32), TT((8, 64), F32)],
        "weight_format",
    ),
    (lambda x, w: op.linear(x, w, out_dtype="i32"), [TT((2, 64), F32), TT((8, 64), F32)], "out_dtype 'i32'"),
    (
        lambda x, w: op.grouped_linear(x, w),
        [TT((2, 3, 16), F32), TT((8, 16), F32)],
        "weight rows 8 must split",
    ),
    (lambda x, w: op.grouped_linear(x, w), [TT((16,), F32), TT((8, 16), F32)], "x must have rank >= 2"),
    (
        lambda x, p: op.rope(x, p, rope_dim=16, theta=1e4),
        [TT((3, 64), F32), TT((3,), "i64")],
        "positions must",
    ),
    (
        lambda x, p: op.rope(x, p, rope_dim=16, theta=1e4),
        [TT((3, 64), F32), TT((4,), "i32")],
        "tokens of positions",
    ),
    (
        lambda x, p: op.rope(x, p, rope_dim=15, theta=1e4),
        [TT((3, 64), F32), TT((3,), "i32")],
        "rope_dim is 15",
    ),
    (lambda x, p: op.rope(x, p, rope_dim=16, theta=1e4), [TT((3, 8), F32), TT((3,), "i32")], "last dim of x"),
    (
        lambda x, p: op.rope(x, p, rope_dim=16, theta=1e4, yarn_factor=16.0),
        [TT((3, 64), F32), TT((3,), "i32")],
        "needs original_max > 0",
    ),
    (
        lambda x, f, b, s: op.hc_pre(x, f, b, s, sinkhorn_iters=20, eps=1e-6, norm_eps=1e-20),
        [TT((3, 4, 8), F32), TT((24, 16), F32), TT((24,), F32), TT((3,), F32)],
        r"fn is .* expected shape \(24, 32\)",
    ),
    (
        lambda x, f, b, s: op.hc_pre(x, f, b, s, sinkhorn_iters=20, eps=1e-6, norm_eps=1e-20),
        [TT((3, 4, 8), F32), TT((24, 32), F32), TT((24,), "bf16"), TT((3,), F32)],
        "base must have dtype",
    ),
    (
        lambda x, f, b, s: op.hc_pre(x, f, b, s, sinkhorn_iters=0, eps=1e-6, norm_eps=1e-20),
        [TT((3, 4, 8), F32), TT((24, 32), F32), TT((24,), F32), TT((3,), F32)],
        "sinkhorn_iters is 0",
    ),
    (lambda x, a: op.hc_collapse(x, a), [TT((3, 4, 8), F32), TT((3, 5), F32)], "a is"),
    (lambda x, a: op.hc_collapse(x, a), [TT((3, 4, 8), "i32"), TT((3, 4), F32)], "x must be a float"),
    (
        lambda y, x, p, c: op.hc_expand(y, x, p, c),
        [TT((3, 9), F32), TT((3, 4, 8), F32), TT((3, 4), F32), TT((3, 4, 4), F32)],
        "y is",
    ),
    (
        lambda y, x, p, c: op.hc_expand(y, x, p, c),
        [TT((3, 8), F32), TT((3, 4, 8), F32), TT((3, 4), F32), TT((3, 4, 3), F32)],
        "comb is",
    ),
]


@pytest.mark.parametrize(("fn", "types", "message"), SHAPE_ERRORS)
def test_shape_rule_rejects_bad_operands(fn: Any, types: list[TT], message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        make_graph(fn, *types)


def test_entry_bytes_match_the_spec_sizes() -> None:
    assert entry_bytes("fp8_g32", 512) == 528
    assert entry_bytes("nvfp4_g16", 512) == entry_bytes("nvfp4_g16_recip", 512) == 288
    assert entry_bytes("mxfp4_g32", 128) == 68
    g = make_graph(lambda x: op.cache_encode(x, fmt="fp8_g32"), TT(("tokens", 512), "bf16"))
    assert g.outputs[0].type == TT(("tokens", 528), "u8")


# ---- act_qdq and the cache codecs ----


def _group(values: list[float], width: int) -> torch.Tensor:
    row = torch.zeros(width)
    row[: len(values)] = torch.tensor(values)
    return row


def test_fp8_g32_values_by_hand() -> None:
    # amax 300 -> scale 2^ceil(log2(300/448)) = 1; E4M3 steps are 32 in [256, 512) and 1/32 in [0.25, 0.5).
    x = torch.stack(
        [_group([300.0, 1.0, 0.3, -0.3], 64), _group([300.0, 1.0], 64) * 2.0**-10, torch.zeros(64)]
    )
    x[0, 32:34] = torch.tensor([7.0, -1000.0])  # second group: amax 1000 -> scale 4; 7/4 = 1.75 exact
    want = torch.stack(
        [_group([288.0, 1.0, 0.3125, -0.3125], 64), _group([288.0, 1.0], 64) * 2.0**-10, torch.zeros(64)]
    )
    want[0, 32:34] = torch.tensor([7.0, -1024.0])  # 1000/4 = 250 -> E4M3 256 (steps of 16 in [128, 256))
    got = out(lambda x: op.act_qdq(x, fmt="fp8_g32"), [TT(("tokens", 64), F32)], [x])
    assert torch.equal(got, want)


def test_mxfp4_g32_ties_go_to_the_even_code() -> None:
    # amax 5 -> scale 1; midpoints 0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4 (spec 3.3); 1.3 -> 1.5 (nearest).
    x = _group([5.0, 0.25, 0.75, -2.5, 1.3, 0.2], 32)[None]
    want = _group([4.0, 0.0, 1.0, -2.0, 1.5, 0.0], 32)[None]
    got = out(lambda x: op.act_qdq(x, fmt="mxfp4_g32"), [TT(("tokens", 32), F32)], [x])
    assert torch.equal(got, want)


def test_nvfp4_divide_and_reciprocal_differ_at_an_exact_tie() -> None:
    # numerics-nemo-vs-deepinfer 2c: sf = 0.029296875 (= 15/512, an E4M3 value), x = 1.25 * sf.
    # x / sf = 1.25 exactly -> tie -> code 2 (1.0); x * fl32(1/sf) lands above 1.25 -> 1.5.
    sf = 15 / 512
    x = _group([6 * sf, 1.25 * sf, -3 * sf], 16)[None]
    divide = out(lambda x: op.act_qdq(x, fmt="nvfp4_g16"), [TT((1, 16), F32)], [x])
    recip = out(lambda x: op.act_qdq(x, fmt="nvfp4_g16_recip"), [TT((1, 16), F32)], [x])
    assert torch.equal(divide, _group([6 * sf, 1.0 * sf, -3 * sf], 16)[None])
    assert torch.equal(recip, _group([6 * sf, 1.5 * sf, -3 * sf], 16)[None])
    entries = {
        fmt: out(lambda x, fmt=fmt: op.cache_encode(x, fmt=fmt), [TT((1, 16), F32)], [x])[0]
        for fmt in ("nvfp4_g16", "nvfp4_g16_recip")
    }
    # E2M1 codes 7 (6.0) | 2 (1.0) << 4, resp. 3 (1.5); code 13 = -3.0; scale byte 0x0F = E4M3 1.875 * 2^-6.
    assert entries["nvfp4_g16"][:2].tolist() == [0x27, 13]
    assert entries["nvfp4_g16_recip"][:2].tolist() == [0x37, 13]
    assert entries["nvfp4_g16"][8].item() == entries["nvfp4_g16_recip"][8].item() == 0x0F


def test_cache_entry_byte_layouts_by_hand() -> None:
    x8 = _group([300.0, 1.0], 32)[None]
    e8 = out(lambda x: op.cache_encode(x, fmt="fp8_g32"), [TT((1, 32), F32)], [x8])[0]
    assert e8[1].item() == 0x38 and e8[32].item() == 127  # E4M3 1.0 = 0 0111 000; UE8M0 2^0 = 127
    x4 = _group([5.0, -0.5, 1.0], 32)[None]
    e4 = out(lambda x: op.cache_encode(x, fmt="mxfp4_g32"), [TT((1, 32), F32)], [x4])[0]
    assert e4.shape == (17,) and e4[0].item() == 6 | (9 << 4) and e4[1].item() == 2 and e4[16].item() == 127


@pytest.mark.parametrize("fmt", ["fp8_g32", "mxfp4_g32", "nvfp4_g16", "nvfp4_g16_recip"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("tokens", [0, 5])
def test_decode_of_encode_equals_act_qdq(fmt: str, dtype: str, tokens: int) -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return {
            "qdq": op.act_qdq(x, fmt=fmt),
            "rt": op.cache_decode(op.cache_encode(x, fmt=fmt), fmt=fmt, width=64, dtype=dtype),
        }

    gen = torch.Generator().manual_seed(7)
    # magnitudes inside every format's range (NVFP4's E4M3 scale saturates at 448 * 6, floors at 6 * 2^-9)
    x = torch.randn(tokens, 2, 64, generator=gen) * torch.tensor([0.5, 300.0])[:, None]
    x = x.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    x[:, 0, :16] = 0  # an all-zero group (padding rows look like this) decodes to zeros
    got = run(f, [TT(("tokens", 2, 64), dtype)], [x])
    assert got["qdq"].dtype == x.dtype and torch.equal(got["qdq"], got["rt"])
    assert not got["qdq"][:, 0, :16].any()
    if tokens:  # qdq is close to x (FP4: within a third of the group's amax), not equal to it
        assert not torch.equal(got["qdq"], x)
        groups = x.float().unflatten(-1, (-1, 16))
        err = (got["qdq"].float().unflatten(-1, (-1, 16)) - groups).abs()
        assert (err <= groups.abs().amax(-1, keepdim=True) / 3).all()


# ---- linear and grouped_linear ----


def assert_close_rel(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    """max |got - want| <= rel * max |want| (a GEMM's rounding scales with its largest terms)."""
    assert got.shape == want.shape
    assert float((got.double() - want.double()).abs().max()) <= rel * float(want.double().abs().max())


def _fp8_weight(
    rows: int, cols: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E4M3 weight, UE8M0 block scales, the dequantized weight built element by element in float64)."""
    w = (torch.randn(rows, cols, generator=gen) * 8).to(torch.float8_e4m3fn)
    exps = torch.randint(120, 132, (-(-rows // 32), -(-cols // 32)), generator=gen, dtype=torch.uint8)
    dense = torch.empty(rows, cols, dtype=torch.float64)
    for r in range(rows):
        for c in range(cols):
            dense[r, c] = float(w[r, c]) * 2.0 ** (int(exps[r // 32, c // 32]) - 127)
    return w, exps.view(torch.float8_e8m0fnu), dense


def test_linear_fp8_block32_dequantizes_by_block() -> None:
    gen = torch.Generator().manual_seed(1)
    w, s, dense = _fp8_weight(40, 64, gen)  # 40 rows: the last row block is partial
    x = torch.randn(3, 2, 64, generator=gen)
    types = [TT(("tokens", 2, 64), F32), TT((40, 64), "f8e4m3"), TT((2, 2), "e8m0")]
    got = out(lambda x, w, s: op.linear(x, w, s, weight_format="fp8_block32"), types, [x, w, s])
    want = x.double() @ dense.T
    assert got.shape == (3, 2, 40) and got.dtype == torch.float32
    assert_close_rel(got, want, 1e-6)
    bf = out(
        lambda x, w, s: op.linear(x, w, s, weight_format="fp8_block32", out_dtype="bf16"), types, [x, w, s]
    )
    assert bf.dtype == torch.bfloat16 and torch.equal(bf, got.bfloat16())


def test_linear_act_quant_rounds_x_to_fp8_groups() -> None:
    # Each 32-group has amax 300 -> scale 1: 300 -> 288, 0.3 -> 0.3125, 1 -> 1 (test_fp8_g32_values_by_hand).
    x = torch.tensor([[300.0, 0.3, 1.0] + [0.0] * 29 + [0.3, 300.0] + [0.0] * 30])
    xq = torch.tensor([[288.0, 0.3125, 1.0] + [0.0] * 29 + [0.3125, 288.0] + [0.0] * 30])
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    types = [TT(("tokens", 64), F32), TT((8, 64), F32)]
    got = out(lambda x, w: op.linear(x, w, act_quant="fp8_g32"), types, [x, w])
    assert_close_rel(got, xq.double() @ w.double().T, 1e-6)
    plain = out(lambda x, w: op.linear(x, w), types, [x, w])
    assert_close_rel(plain, x.double() @ w.double().T, 1e-6)
    assert not torch.allclose(got, plain)


@pytest.mark.parametrize("fp8", [False, True])
def test_grouped_linear_multiplies_group_g_by_its_row_block(fp8: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    groups, k, n = 2, 64, 48
    x = torch.randn(4, 3, groups, k, generator=gen)
    if fp8:
        w, s, dense = _fp8_weight(groups * n, k, gen)
        types = [TT(("tokens", 3, groups, k), F32), TT((groups * n, k), "f8e4m3"), TT((3, 2), "e8m0")]
        got = out(lambda x, w, s: op.grouped_linear(x, w, s, weight_format="fp8_block32"), types, [x, w, s])
    else:
        w = torch.randn(groups * n, k, generator=gen)
        dense = w.double()
        got = out(
            lambda x, w: op.grouped_linear(x, w),
            [TT(("tokens", 3, groups, k), F32), TT((groups * n, k), F32)],
            [x, w],
        )
    want = torch.stack([x[..., g, :].double() @ dense[g * n : (g + 1) * n].T for g in range(groups)], dim=-2)
    assert got.shape == (4, 3, groups, n)
    assert_close_rel(got, want, 1e-6)


# ---- rope ----


def test_yarn_bounds_of_the_released_and_tiny_configs() -> None:
    assert yarn_bounds(64, 160000.0, 32.0, 1.0, 65536) == (15, 25)  # spec 3.2
    # tiny: 16*ln(64/(2pi*32))/(2 ln 160000) = -0.76 -> 0; 16*ln(64/2pi)/(2 ln 160000) = 1.55 -> 2
    assert yarn_bounds(16, 160000.0, 32.0, 1.0, 64) == (0, 2)


def _rope_float64(
    x: torch.Tensor,
    pos: torch.Tensor,
    dim: int,
    theta: float,
    factor: float = 1.0,
    bounds: tuple[int, int] = (0, 0),
    inverse: bool = False,
) -> torch.Tensor:
    """Spec 3.2 in float64, pair by pair: w_j = theta^(-2j/d), YaRN blend, rotate pairs (2j, 2j+1)."""
    y = x.double().clone()
    lo, hi = bounds
    for j in range(dim // 2):
        w = theta ** (-2 * j / dim)
        if factor > 1:
            r = min(max((j - lo) / max(hi - lo, 1e-3), 0.0), 1.0)
            w = w * (1 - r) + w / factor * r
        ang = pos.double() * w * (-1 if inverse else 1)
        ang = ang.reshape(-1, *([1] * (x.dim() - 2)))
        a, b = x[..., x.shape[-1] - dim + 2 * j].double(), x[..., x.shape[-1] - dim + 2 * j + 1].double()
        y[..., x.shape[-1] - dim + 2 * j] = a * torch.cos(ang) - b * torch.sin(ang)
        y[..., x.shape[-1] - dim + 2 * j + 1] = a * torch.sin(ang) + b * torch.cos(ang)
    return y


@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_matches_the_spec_formula(yarn: bool, inverse: bool) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 2, 3, 40, generator=gen)  # two head dims; rotate the last 16 of 40 channels
    pos = torch.tensor([0, 1, 2, 7, 100, 150], dtype=torch.int32)
    kw: dict[str, Any] = dict(rope_dim=16, theta=160000.0, inverse=inverse)
    if yarn:
        kw.update(yarn_factor=16.0, original_max=64)
    got = out(
        lambda x, p: op.rope(x, p, **kw), [TT(("tokens", 2, 3, 40), F32), TT(("tokens",), "i32")], [x, pos]
    )
    want = _rope_float64(x, pos, 16, 160000.0, 16.0 if yarn else 1.0, (0, 2), inverse)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)  # f32 angles vs float64
    assert torch.equal(got[..., :24], x[..., :24])  # non-rotary channels pass through
    assert torch.equal(got[0], x[0])  # position 0 is the identity, exactly


def test_rope_inverse_undoes_rope_and_keeps_dtype() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, 64, generator=gen)
    pos = torch.tensor([3, 1000, 65535, 70000, 1048575], dtype=torch.int32)
    kw = dict(rope_dim=64, theta=160000.0, yarn_factor=16.0, original_max=65536)

    def f(x, p):  # type: ignore[no-untyped-def]
        return op.rope(op.rope(x, p, **kw), p, inverse=True, **kw)

    torch.testing.assert_close(
        out(f, [TT(("tokens", 64), F32), TT(("tokens",), "i32")], [x, pos]), x, rtol=0, atol=1e-5
    )
    xb, pos = x.bfloat16(), torch.tensor([3, 10, 100, 200, 500], dtype=torch.int32)
    types = [TT(("tokens", 64), "bf16"), TT(("tokens",), "i32")]
    got = out(lambda x, p: op.rope(x, p, rope_dim=64, theta=1e4), types, [xb, pos])
    assert got.dtype == torch.bfloat16
    want = _rope_float64(xb.float(), pos, 64, 1e4)
    # one bf16 rounding of the f32 result
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2)


def test_rope_on_zero_tokens() -> None:
    got = out(
        lambda x, p: op.rope(x, p, rope_dim=16, theta=1e4),
        [TT(("tokens", 4, 32), F32), TT(("tokens",), "i32")],
        [torch.zeros(0, 4, 32), torch.zeros(0, dtype=torch.int32)],
    )
    assert got.shape == (0, 4, 32)


# ---- mHC ----


def _hc_pre_float64(
    x: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    iters: int,
    eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, ...]:
    """Spec 4.4 written out in float64, one token at a time."""
    n = x.shape[1]
    pres, posts, combs = [], [], []
    for v in x.double().flatten(1):
        mix = (fn.double() @ v) / math.sqrt(float((v * v).mean()) + norm_eps)
        s = torch.cat(
            [scale[0].double().repeat(n), scale[1].double().repeat(n), scale[2].double().repeat(n * n)]
        )
        z = base.double() + mix * s
        c = torch.softmax(z[2 * n :].reshape(n, n), dim=1) + eps
        c = c / (c.sum(0, keepdim=True) + eps)
        for _ in range(iters - 1):
            c = c / (c.sum(1, keepdim=True) + eps)
            c = c / (c.sum(0, keepdim=True) + eps)
        pres.append(torch.sigmoid(z[:n]) + eps)
        posts.append(2 * torch.sigmoid(z[n : 2 * n]))
        combs.append(c)
    return torch.stack(pres), torch.stack(posts), torch.stack(combs)


HC_TYPES = [TT(("tokens", 4, 16), F32), TT((24, 64), F32), TT((24,), F32), TT((3,), F32)]


def _hc_pre(iters: int) -> Any:
    return lambda x, f, b, s: op.hc_pre(x, f, b, s, sinkhorn_iters=iters, eps=1e-6, norm_eps=1e-20)


def test_hc_pre_matches_the_spec_formula() -> None:
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(5, 4, 16, generator=gen)
    x[2] = 0  # a padding row: the RMS factor is 1e10 but the projection is 0, so z = base
    fn, base = torch.randn(24, 64, generator=gen) * 0.1, torch.randn(24, generator=gen)
    scale = torch.tensor([0.5, 1.5, 2.0])
    got = run(_hc_pre(20), HC_TYPES, [x, fn, base, scale])
    want = _hc_pre_float64(x, fn, base, scale, 20, 1e-6, 1e-20)
    for i, w in enumerate(want):
        torch.testing.assert_close(got[str(i)].double(), w, rtol=1e-5, atol=1e-6)
    # z = base exactly; the cpu rule's sigmoid is the f64 one rounded to f32 (batch invariant, see
    # platform/cpu/invariant.py), which can differ by 1 ulp from torch's f32 sigmoid.
    assert torch.equal(got["0"][2], torch.sigmoid(base[:4].double()).float() + 1e-6)
    comb = got["2"]
    # columns are normalised last; rows are close to 1 too (near doubly stochastic)
    torch.testing.assert_close(comb.sum(1), torch.ones(5, 4), rtol=0, atol=1e-4)
    torch.testing.assert_close(comb.sum(2), torch.ones(5, 4), rtol=0, atol=1e-3)


def test_hc_pre_with_one_sinkhorn_iteration_is_softmax_then_column_normalisation() -> None:
    gen = torch.Generator().manual_seed(8)
    x, fn, base = torch.randn(3, 4, 16, generator=gen), torch.zeros(24, 64), torch.randn(24, generator=gen)
    comb = run(_hc_pre(1), HC_TYPES, [x, fn, base, torch.ones(3)])["2"]
    c = torch.softmax(base[8:].double().reshape(4, 4), dim=1) + 1e-6
    torch.testing.assert_close(comb.double(), (c / (c.sum(0) + 1e-6)).expand(3, 4, 4), rtol=1e-6, atol=1e-7)


def test_hc_collapse_and_expand_by_hand() -> None:
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # one token, n = 2 streams, H = 2
    a = torch.tensor([[0.5, 2.0]])
    got = out(
        lambda x, a: op.hc_collapse(x, a, out_dtype="bf16"),
        [TT(("tokens", 2, 2), F32), TT(("tokens", 2), F32)],
        [x, a],
    )
    assert got.dtype == torch.bfloat16 and got.tolist() == [[6.5, 9.0]]
    y, post = torch.tensor([[10.0, 20.0]]), torch.tensor([[1.0, 0.5]])
    comb = torch.tensor([[[0.25, 0.75], [0.5, 1.0]]])  # comb[i, j]: input stream i -> output stream j
    types = [
        TT(("tokens", 2), F32),
        TT(("tokens", 2, 2), F32),
        TT(("tokens", 2), F32),
        TT(("tokens", 2, 2), F32),
    ]
    got = out(lambda y, x, p, c: op.hc_expand(y, x, p, c), types, [y, x, post, comb])
    # j=0: 1*y + 0.25*x0 + 0.5*x1 = [10+0.25+1.5, 20+0.5+2]
    # j=1: 0.5*y + 0.75*x0 + 1*x1 = [5+0.75+3, 10+1.5+4]
    assert got.tolist() == [[[11.75, 22.5], [8.75, 15.5]]]


def test_hc_expand_keeps_the_stream_dtype_and_runs_on_zero_tokens() -> None:
    types = [
        TT(("tokens", 8), "bf16"),
        TT(("tokens", 4, 8), "bf16"),
        TT(("tokens", 4), F32),
        TT(("tokens", 4, 4), F32),
    ]
    got = out(
        lambda y, x, p, c: op.hc_expand(y, x, p, c),
        types,
        [
            torch.zeros(0, 8).bfloat16(),
            torch.zeros(0, 4, 8).bfloat16(),
            torch.zeros(0, 4),
            torch.zeros(0, 4, 4),
        ],
    )
    assert got.shape == (0, 4, 8) and got.dtype == torch.bfloat16
