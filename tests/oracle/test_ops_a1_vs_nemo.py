"""Group A1 ops traced and run on cpu, against NeMo AutoModel 0.7.0's V4.1 functions and modules.

Sizes: the tiny config of spec section 10 and the released config (some at fewer tokens/heads).
Element-wise ops (qdq, codecs, rope, collapse, expand) must be bit-exact, and so must hc_pre (its one
GEMM is the same F.linear call on the same shapes as NeMo's; the fused multiply-add of z is what makes
it exact). linear and grouped_linear are compared at 1e-5 relative to the largest output: their GEMMs
differ in shape or kernel from NeMo's, and BLAS summation order is not part of the contract.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("nemo_automodel")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from nemo_automodel.components.models.deepseek_v4.layers import DeepseekV4GroupedLinear  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.attention import _apply_rope, _RotaryEmbedding  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41TextConfig  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.layers import DeepseekV41HyperConnection  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.quantization import quantize_cache  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.state_dict_adapter import (  # noqa: E402
    dequantize_checkpoint_weight,
)

from dsgraph.graph import TensorType as TT  # noqa: E402
from dsgraph.graph import make_graph  # noqa: E402
from dsgraph.models.deepseek_v41.tiny import TINY_CONFIG  # noqa: E402
from dsgraph.ops import op  # noqa: E402
from dsgraph.ops.rope import RopeParams  # noqa: E402
from dsgraph.platform.cpu.interpret import run_graph  # noqa: E402
from dsgraph.platform.cpu.rules_rope import rope_frequencies  # noqa: E402
from tests.oracle.nemo_ref import nemo_comparable  # noqa: E402

TINY = DeepseekV41TextConfig(**{**TINY_CONFIG["text_config"], "dtype": "float32"})
RELEASED = DeepseekV41TextConfig()  # NeMo's defaults are the released Flash config (spec 1.1)
CONFIGS = {"tiny": TINY, "released": RELEASED}
NEMO_FORMAT = {"fp8_g32": ("fp8", 32), "mxfp4_g32": ("mxfp4", 32), "nvfp4_g16": ("nvfp4", 16)}


def run(fn: Any, types: list[TT], args: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return run_graph(make_graph(fn, *types), args)


def assert_close_rel(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert float((got.double() - want.double()).abs().max()) <= rel * float(want.double().abs().max())


def _activations(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random rows spanning many magnitudes, with some exact zeros and a few scale-aligned ties."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * torch.logspace(-3, 3, shape[0])[:, None]
    x[0, :16] = 0
    x[1, :8] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # E2M1 midpoints at scale 1
    return x


# ---- act_qdq, cache_encode/decode vs NeMo's quantize_cache ----


@pytest.mark.parametrize("fmt", sorted(NEMO_FORMAT))
@pytest.mark.parametrize("width", [32, 64, 128, 512])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_qdq_and_codecs_equal_nemo_bit_for_bit(fmt: str, width: int, dtype: str) -> None:
    x = _activations((24, width), seed=width).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    x = nemo_comparable(x, fmt, NEMO_FORMAT[fmt][1])

    def f(x):  # type: ignore[no-untyped-def]
        entries = op.cache_encode(x, fmt=fmt)
        return {
            "qdq": op.act_qdq(x, fmt=fmt),
            "rt": op.cache_decode(entries, fmt=fmt, width=width, dtype=dtype),
        }

    got = run(f, [TT(("tokens", width), dtype)], [x])
    nemo_format, block = NEMO_FORMAT[fmt]
    want = quantize_cache(x, format=nemo_format, block_size=block)
    assert torch.equal(got["qdq"], want) and got["qdq"].dtype == want.dtype
    assert torch.equal(got["rt"], want)


def test_nvfp4_reciprocal_differs_from_nemo_only_at_exact_ties() -> None:
    # NeMo divides by the E4M3 scale; DeepInfer multiplies by its FP32 reciprocal (numerics 2c). Build groups
    # whose values are scale * (E2M1 levels and midpoints), so ties are common, plus plain random groups.
    gen = torch.Generator().manual_seed(11)
    sf = (torch.rand(64, 1, generator=gen) * 4 + 0.05).to(torch.float8_e4m3fn).float()
    grid = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0])
    picks = grid[torch.randint(0, len(grid), (64, 16), generator=gen)]
    picks[:, 0] = 6.0  # amax = 6 * sf, so the group's scale is sf again
    signs = torch.where(torch.rand(64, 16, generator=gen) < 0.5, -1.0, 1.0)
    x = torch.cat([picks * signs * sf, torch.randn(64, 16, generator=gen)])
    got = run(lambda x: op.act_qdq(x, fmt="nvfp4_g16_recip"), [TT(("tokens", 16), "f32")], [x])["out"]
    want = quantize_cache(x, format="nvfp4", block_size=16)
    scale = (x.abs().amax(-1, keepdim=True).clamp_min(6 * 2**-9) / 6).to(torch.float8_e4m3fn).float()
    ratio = (x / scale).abs()
    ties = (ratio.unsqueeze(-1) == torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])).any(-1)
    differs = got != want
    assert differs.any(), "the tie-rich groups should exercise at least one reciprocal rounding difference"
    assert not (differs & ~ties).any(), "reciprocal and divide may only differ at exact ties"
    # at such a tie both are the two levels around the midpoint: equally far from it, on opposite sides
    sf_d, ratio_d = scale.expand_as(x)[differs], ratio[differs]
    above_got, above_want = (got[differs] / sf_d).abs() - ratio_d, (want[differs] / sf_d).abs() - ratio_d
    assert torch.equal(above_got, -above_want) and (above_got != 0).all()


# ---- linear, grouped_linear vs NeMo's dequantizer and grouped linear ----


def _fp8_checkpoint_weight(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=gen) * 16).to(torch.float8_e4m3fn)
    exps = torch.randint(118, 130, (-(-rows // 32), -(-cols // 32)), generator=gen, dtype=torch.uint8)
    return w, exps.view(torch.float8_e8m0fnu)


# tiny wq_a, partial row and column blocks, a larger matrix
@pytest.mark.parametrize(("rows", "cols"), [(32, 64), (40, 96), (1280, 512)])
@pytest.mark.parametrize("act_quant", ["none", "fp8_g32"])
def test_fp8_linear_equals_nemo_dequantized_linear(rows: int, cols: int, act_quant: str) -> None:
    w, s = _fp8_checkpoint_weight(rows, cols, seed=rows)
    x = _activations((7, cols), seed=cols)
    types = [TT(("tokens", cols), "f32"), TT((rows, cols), "f8e4m3"), TT(tuple(s.shape), "e8m0")]
    got = run(
        lambda x, w, s: op.linear(x, w, s, weight_format="fp8_block32", act_quant=act_quant), types, [x, w, s]
    )
    # NeMo has no activation quantization (numerics 2d); DeepInfer's FP8 activation cast is the same
    # rule as NeMo's SWA-cache FP8 quantizer (E4M3, groups of 32, UE8M0 scale), so that is the reference.
    x_ref = quantize_cache(x, format="fp8", block_size=32) if act_quant == "fp8_g32" else x
    want = F.linear(x_ref, dequantize_checkpoint_weight(w, s, dtype=torch.float32))
    assert_close_rel(got["out"], want)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("fp8", [False, True])
def test_grouped_linear_equals_nemo_wo_a(config: str, fp8: bool) -> None:
    cfg = CONFIGS[config]
    groups = cfg.o_groups
    heads = 4 if config == "tiny" else 8  # released: one head per group keeps the test small
    k = heads * cfg.head_dim // groups
    rows = groups * (cfg.o_lora_rank if config == "tiny" else 64)
    nemo = DeepseekV4GroupedLinear(k, rows, groups)
    x = torch.randn(5, groups, k, generator=torch.Generator().manual_seed(rows))
    if fp8:
        w, s = _fp8_checkpoint_weight(rows, k, seed=k)
        with torch.no_grad():
            nemo.weight.copy_(dequantize_checkpoint_weight(w, s, dtype=torch.float32))
        types = [TT(("tokens", groups, k), "f32"), TT((rows, k), "f8e4m3"), TT(tuple(s.shape), "e8m0")]
        got = run(lambda x, w, s: op.grouped_linear(x, w, s, weight_format="fp8_block32"), types, [x, w, s])
    else:
        types = [TT(("tokens", groups, k), "f32"), TT((rows, k), "f32")]
        got = run(lambda x, w: op.grouped_linear(x, w), types, [x, nemo.weight.detach()])
    with torch.no_grad():
        assert_close_rel(got["out"], nemo(x))


# ---- rope vs NeMo's _RotaryEmbedding + _apply_rope ----


def _rope_params(cfg: DeepseekV41TextConfig, compressed: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"rope_dim": cfg.qk_rope_head_dim, "theta": float(cfg.rope_theta)}
    if compressed:
        yarn = cfg.rope_scaling
        kw.update(
            theta=float(cfg.compress_rope_theta),
            yarn_factor=float(yarn["factor"]),
            beta_fast=float(yarn["beta_fast"]),
            beta_slow=float(yarn["beta_slow"]),
            original_max=int(yarn["original_max_position_embeddings"]),
        )
    return kw


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("compressed", [False, True])
def test_rope_frequency_table_equals_nemo_bit_for_bit(config: str, compressed: bool) -> None:
    cfg = CONFIGS[config]
    nemo_freqs = _RotaryEmbedding(cfg, compressed=compressed)(torch.ones(1, 1, dtype=torch.long))[0, 0]
    assert torch.equal(rope_frequencies(RopeParams(**_rope_params(cfg, compressed))), nemo_freqs)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_equals_nemo_bit_for_bit(config: str, compressed: bool, inverse: bool) -> None:
    cfg = CONFIGS[config]
    gen = torch.Generator().manual_seed(3)
    tokens, heads = 9, 4
    positions = torch.cat(
        [torch.tensor([0, 1, 65535, 65536]), torch.randint(0, 1 << 20, (tokens - 4,), generator=gen)]
    )
    positions = positions.to(torch.int32)
    angles = _RotaryEmbedding(cfg, compressed=compressed)(positions[None].long())
    kw = {**_rope_params(cfg, compressed), "inverse": inverse}
    # query-like [T, heads, head_dim], key-like [T, head_dim] and index-head [T, heads, index_head_dim]
    for shape in [(tokens, heads, cfg.head_dim), (tokens, cfg.head_dim), (tokens, heads, cfg.index_head_dim)]:
        x = torch.randn(shape, generator=gen)
        types = [TT(("tokens", *shape[1:]), "f32"), TT(("tokens",), "i32")]
        got = run(lambda x, p: op.rope(x, p, **kw), types, [x, positions])["out"]
        want = _apply_rope(x[None], angles, inverse=inverse)[0]
        assert torch.equal(got, want), f"shape {shape}"


def test_rope_bf16_equals_nemo_bit_for_bit() -> None:
    positions = torch.arange(0, 700, 100, dtype=torch.int32)
    x = torch.randn(7, 4, TINY.head_dim, generator=torch.Generator().manual_seed(9)).bfloat16()
    kw = _rope_params(TINY, compressed=True)
    got = run(
        lambda x, p: op.rope(x, p, **kw),
        [TT(("tokens", 4, 64), "bf16"), TT(("tokens",), "i32")],
        [x, positions],
    )
    want = _apply_rope(x[None], _RotaryEmbedding(TINY, compressed=True)(positions[None].long()))[0]
    assert torch.equal(got["out"], want)


# ---- mHC vs NeMo's DeepseekV41HyperConnection ----


def _nemo_hc(cfg: DeepseekV41TextConfig, seed: int) -> DeepseekV41HyperConnection:
    torch.manual_seed(seed)  # NeMo's reset_parameters draws fn from the global generator
    hc = DeepseekV41HyperConnection(cfg)
    with torch.no_grad():
        hc.base.normal_()
        hc.scale.uniform_(0.5, 2.0)
    return hc


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_hc_pre_collapse_expand_equal_nemo(config: str) -> None:
    cfg = CONFIGS[config]
    n, hidden, tokens = cfg.hc_mult, cfg.hidden_size, 6 if config == "tiny" else 2
    hc = _nemo_hc(cfg, seed=hidden)
    gen = torch.Generator().manual_seed(hidden)
    x, y = torch.randn(tokens, n, hidden, generator=gen), torch.randn(tokens, hidden, generator=gen)
    with torch.no_grad():
        mix = hc(x[None])
    params = dict(sinkhorn_iters=cfg.hc_sinkhorn_iters, eps=cfg.hc_eps, norm_eps=cfg.rms_norm_eps)
    m = 2 * n + n * n

    def f(x, fn, base, scale, y):  # type: ignore[no-untyped-def]
        pre, post, comb = op.hc_pre(x, fn, base, scale, **params)
        return {
            "pre": pre,
            "post": post,
            "comb": comb,
            "collapse": op.hc_collapse(x, pre, out_dtype="f32"),
            "expand": op.hc_expand(y, x, post, comb),
        }

    types = [
        TT(("tokens", n, hidden), "f32"),
        TT((m, n * hidden), "f32"),
        TT((m,), "f32"),
        TT((3,), "f32"),
        TT(("tokens", hidden), "f32"),
    ]
    got = run(f, types, [x, hc.fn.detach(), hc.base.detach(), hc.scale.detach(), y])
    # The cpu projection is computed row by row (batch invariant), NeMo's as one GEMM: f32 rounding only.
    for name in ("pre", "post", "comb"):
        torch.testing.assert_close(got[name], getattr(mix, name)[0], rtol=2e-6, atol=1e-7, msg=name)
    # Collapse and expand are element-wise: exact, given the same coefficients.
    assert torch.equal(got["collapse"], DeepseekV41HyperConnection.collapse(x[None], got["pre"][None])[0])
    nemo_mix = type(mix)(got["pre"][None], got["post"][None], got["comb"][None])
    assert torch.equal(got["expand"], DeepseekV41HyperConnection.expand(y[None], x[None], nemo_mix)[0])


def test_hc_collapse_bf16_equals_nemo() -> None:
    gen = torch.Generator().manual_seed(12)
    x, a = torch.randn(5, 4, 64, generator=gen).bfloat16(), torch.rand(5, 4, generator=gen)
    got = run(
        lambda x, a: op.hc_collapse(x, a, out_dtype="bf16"),
        [TT(("tokens", 4, 64), "bf16"), TT(("tokens", 4), "f32")],
        [x, a],
    )
    assert torch.equal(got["out"], DeepseekV41HyperConnection.collapse(x[None], a[None])[0])


def test_released_yarn_bounds_follow_nemo_and_spec() -> None:
    # The spec's (lo, hi) = (15, 25) for the released config shows up in NeMo's table as untouched and
    # fully divided frequencies.
    freqs = rope_frequencies(RopeParams(**_rope_params(RELEASED, compressed=True)))
    plain = rope_frequencies(RopeParams(rope_dim=64, theta=160000.0))
    assert torch.equal(freqs[:16], plain[:16]) and not torch.equal(freqs[16], plain[16])
    torch.testing.assert_close(freqs[25:], plain[25:] / 16, rtol=1e-6, atol=0)
    assert math.isclose(float(freqs[20] / plain[20]), 1 - 0.5 * (15 / 16), rel_tol=1e-6)  # r = 0.5 halfway
