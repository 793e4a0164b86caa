"""Group A2 ops (MoE routing/experts, SwiGLU, Engram hash/rows/gate): shape rules and cpu rules.

Expected values come from hand formulas written here (per-row Python loops), from the numpy Engram
reference `models/deepseek_v41/engram_hash.py` (another implementation) and from the weight codecs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import dsgraph.ops  # noqa: F401
from dsgraph.graph import ShapeError, TensorType, make_graph
from dsgraph.models.deepseek_v41.engram_hash import EngramSpec, engram_primes, engram_rows
from dsgraph.ops import engram as EG
from dsgraph.ops import moe as M
from dsgraph.platform.cpu.interpret import ExecutionError, run_graph
from dsgraph.platform.cpu.quant import fp4_rows_dequantize, fp4_rows_quantize, fp8_g32_qdq, fp8_rows_quantize

T_ = TensorType


def _run(fn: Any, types: list[TensorType], args: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return run_graph(make_graph(fn, *types), args)


def _ty(t: torch.Tensor, first: int | str | None = None) -> TensorType:
    from dsgraph.platform.cpu.dtypes import to_ir

    shape = tuple(t.shape)
    return TensorType((first, *shape[1:]) if first is not None else shape, to_ir(t.dtype))


# ---- moe_route ----


def _route_by_hand(u: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, k: int, scale: float):  # type: ignore[no-untyped-def]
    weights, ids = [], []
    for t in range(u.shape[0]):
        s = [
            math.sqrt(math.log1p(math.exp(float(u[t].double() @ gate_w[e].double()))))
            for e in range(gate_w.shape[0])
        ]
        b = bias[t] if bias.dim() == 2 else bias
        order = sorted(range(len(s)), key=lambda e: (-(s[e] + float(b[e])), e))[:k]
        total = sum(s[e] for e in order)
        ids.append(order)
        weights.append([s[e] / total * scale for e in order])
    return torch.tensor(weights), torch.tensor(ids, dtype=torch.int32)


def _route(
    u: torch.Tensor, w: torch.Tensor, b: torch.Tensor, k: int, scale: float = 1.5
) -> tuple[torch.Tensor, ...]:
    def f(u, w, b):  # type: ignore[no-untyped-def]
        return M.moe_route(u, w, b, topk=k, routed_scaling=scale)

    out = _run(f, [_ty(u, "tokens"), _ty(w), _ty(b, "tokens" if b.dim() == 2 else None)], [u, w, b])
    return out["0"], out["1"]


@pytest.mark.parametrize("tokens,experts,k", [(5, 8, 2), (3, 16, 6)])
def test_moe_route_matches_hand_formula(tokens: int, experts: int, k: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    u, w = torch.randn(tokens, 32, generator=gen), torch.randn(experts, 32, generator=gen) * 0.3
    bias = torch.randn(experts, generator=gen) * 0.5
    weights, ids = _route(u, w, bias, k)
    want_w, want_ids = _route_by_hand(u, w, bias, k, 1.5)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w.float(), rtol=1e-5, atol=1e-6)


def test_moe_route_ties_go_to_lowest_id_and_bias_only_selects() -> None:
    u = torch.zeros(2, 32)  # every logit 0: every score is sqrt(ln 2)
    w = torch.randn(6, 32)
    bias = torch.zeros(6)
    weights, ids = _route(u, w, bias, 3, scale=1.5)
    assert ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    torch.testing.assert_close(weights, torch.full((2, 3), 0.5))
    bias[4] = 1.0  # expert 4 wins the selection; its weight still uses the unbiased score
    weights, ids = _route(u, w, bias, 3, scale=1.5)
    assert ids.tolist() == [[4, 0, 1], [4, 0, 1]]
    torch.testing.assert_close(weights, torch.full((2, 3), 0.5))


def test_moe_route_per_row_bias() -> None:
    gen = torch.Generator().manual_seed(3)
    u, w = torch.randn(4, 32, generator=gen), torch.randn(8, 32, generator=gen) * 0.2
    bias = torch.zeros(4, 8)
    bias[1, 7] = bias[3, 5] = 10.0  # "image" rows pick a different expert first
    weights, ids = _route(u, w, bias, 2)
    want_w, want_ids = _route_by_hand(u, w, bias, 2, 1.5)
    assert torch.equal(ids, want_ids) and ids[1, 0] == 7 and ids[3, 0] == 5
    torch.testing.assert_close(weights, want_w.float(), rtol=1e-5, atol=1e-6)


def test_moe_route_shape_errors() -> None:
    u, w = T_(("tokens", 32), "f32"), T_((8, 32), "f32")
    with pytest.raises(ShapeError, match="bias must have dtype"):
        make_graph(lambda u, w, b: M.moe_route(u, w, b, topk=2, routed_scaling=1.0), u, w, T_((8,), "bf16"))
    with pytest.raises(ShapeError, match=r"bias must have shape \[8\]"):
        make_graph(lambda u, w, b: M.moe_route(u, w, b, topk=2, routed_scaling=1.0), u, w, T_((7,), "f32"))
    with pytest.raises(ShapeError, match="topk is 9"):
        make_graph(lambda u, w, b: M.moe_route(u, w, b, topk=9, routed_scaling=1.0), u, w, T_((8,), "f32"))
    with pytest.raises(ShapeError, match="gate_w .* hidden width"):
        make_graph(
            lambda u, w, b: M.moe_route(u, w, b, topk=2, routed_scaling=1.0),
            u,
            T_((8, 16), "f32"),
            T_((8,), "f32"),
        )


# ---- moe_experts / swiglu ----


def _silu(x: float) -> float:
    return x / (1.0 + math.exp(-x))


def _experts_by_hand(x, ids, weights, w1, w3, w2, limit, act_quant="none", bf16_gemms=False):  # type: ignore[no-untyped-def]
    """Row by row, slot by slot (f32), the routing weight multiplied before w2; `bf16_gemms` rounds every
    expert GEMM output (w1 x, w3 x, w2 a) to BF16 (DeepInfer)."""

    def gemm(w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        y = w.float() @ a
        return y.bfloat16().float() if bf16_gemms else y

    out = torch.zeros(x.shape, dtype=torch.float32)
    xin = fp8_g32_qdq(x.float()) if act_quant == "fp8_g32" else x.float()
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            g = gemm(w1[e], xin[t]).clamp(max=limit)
            v = gemm(w3[e], xin[t]).clamp(-limit, limit)
            a = g * torch.sigmoid(g) * v * weights[t, j]
            a = fp8_g32_qdq(a) if act_quant == "fp8_g32" else a.to(x.dtype).float()
            out[t] += gemm(w2[e], a)
    return out


def _experts(x, ids, weights, ws, limit=10.0, **kw):  # type: ignore[no-untyped-def]
    def f(x, ids, weights, *ws):  # type: ignore[no-untyped-def]
        return M.moe_experts(x, ids, weights, *ws, swiglu_limit=limit, **kw)

    types = [_ty(x, "tokens"), _ty(ids, "tokens"), _ty(weights, "tokens"), *(_ty(w) for w in ws)]
    return _run(f, types, [x, ids, weights, *ws])["out"]


def _expert_case(seed: int, tokens: int = 6, experts: int = 5, hidden: int = 64, inter: int = 32):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen) * 3.0  # large enough that some w1 x exceed the clamp
    ids = torch.randint(0, experts, (tokens, 2), generator=gen, dtype=torch.int32)
    ids[1] = -1  # a padding row
    ids[2, 1] = -1  # a padding slot
    weights = torch.rand(tokens, 2, generator=gen)
    w1 = torch.randn(experts, inter, hidden, generator=gen)
    w3 = torch.randn(experts, inter, hidden, generator=gen)
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.1
    return x, ids, weights, w1, w3, w2


def test_moe_experts_dense_matches_hand_loop_and_padding_is_zero() -> None:
    x, ids, weights, w1, w3, w2 = _expert_case(0)
    assert (w1[ids[0, 0]] @ x[0]).abs().max() > 10  # the clamp is exercised
    got = _experts(x, ids, weights, (w1, w3, w2))
    torch.testing.assert_close(got, _experts_by_hand(x, ids, weights, w1, w3, w2, 10.0), rtol=1e-5, atol=1e-4)
    assert torch.equal(got[1], torch.zeros(64))
    no_routes = _experts(x, torch.full_like(ids, -1), weights, (w1, w3, w2))
    assert torch.equal(no_routes, torch.zeros_like(x))


def test_moe_experts_mxfp4_rows_equals_dense_of_decoded_weights() -> None:
    x, ids, weights, w1, w3, w2 = _expert_case(1)
    packed = [[fp4_rows_quantize(w[e]) for e in range(w.shape[0])] for w in (w1, w3, w2)]
    qs = [torch.stack([p[0] for p in ps]) for ps in packed]
    ss = [torch.stack([p[1] for p in ps]) for ps in packed]
    dense = [torch.stack([fp4_rows_dequantize(*p) for p in ps]) for ps in packed]
    got = _experts(x, ids, weights, (*qs, *ss), weight_format="mxfp4_rows")
    assert torch.equal(got, _experts(x, ids, weights, tuple(dense)))


def test_moe_experts_fp8_activations_and_bf16() -> None:
    x, ids, weights, w1, w3, w2 = _expert_case(2)
    got = _experts(x, ids, weights, (w1, w3, w2), act_quant="fp8_g32")
    want = _experts_by_hand(x, ids, weights, w1, w3, w2, 10.0, act_quant="fp8_g32")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(got, _experts(x, ids, weights, (w1, w3, w2)), rtol=1e-3)
    xb = x.bfloat16()
    got = _experts(xb, ids, weights, (w1, w3, w2), out_dtype="bf16")
    assert got.dtype == torch.bfloat16
    want = _experts_by_hand(xb, ids, weights, w1, w3, w2, 10.0).bfloat16()
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_moe_experts_bf16_gemm_outputs_match_hand_loop() -> None:
    """gemm_out_dtype 'bf16' rounds w1 x and w3 x before the clamp and each expert's w2 output before
    the f32 sum. The f32 hand loop sums in another order, so sums agree to f32 rounding (the BF16
    rounding itself is compared exactly through a one-slot, one-expert case)."""
    x, ids, weights, w1, w3, w2 = _expert_case(4)
    for act_quant in ("none", "fp8_g32"):
        got = _experts(x, ids, weights, (w1, w3, w2), act_quant=act_quant, gemm_out_dtype="bf16")
        want = _experts_by_hand(x, ids, weights, w1, w3, w2, 10.0, act_quant=act_quant, bf16_gemms=True)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
        plain = _experts(x, ids, weights, (w1, w3, w2), act_quant=act_quant)
        assert not torch.allclose(got, plain, rtol=1e-4, atol=1e-4), "gemm_out_dtype='bf16' changed nothing"
    # One expert per row: the output is exactly one BF16-rounded w2 output (f32 holding BF16 values).
    one = ids[:, :1].clone()
    got = _experts(x, one, weights[:, :1].contiguous(), (w1, w3, w2), gemm_out_dtype="bf16")
    assert torch.equal(got, got.bfloat16().float())
    assert not torch.equal(got, _experts(x, one, weights[:, :1].contiguous(), (w1, w3, w2)))
    # The rounding is per element: any subset of rows computes its rows bit-equal to the whole batch.
    for part in (slice(0, 1), slice(2, 5), slice(3, 6)):
        sub = _experts(x[part], ids[part], weights[part], (w1, w3, w2), gemm_out_dtype="bf16")
        full = _experts(x, ids, weights, (w1, w3, w2), gemm_out_dtype="bf16")
        assert torch.equal(sub, full[part]), f"rows {part} depend on the batch"


def test_moe_experts_errors() -> None:
    x, ids, weights, w1, w3, w2 = _expert_case(3)
    ids[4, 1] = 5
    with pytest.raises(ExecutionError, match=r"ids\[4, 1\] = 5 is outside \[0, 5\)"):
        _experts(x, ids, weights, (w1, w3, w2))
    with pytest.raises(ShapeError, match="takes 9 operands, got 6"):
        _experts(x, ids, weights, (w1, w3, w2), weight_format="mxfp4_rows")
    with pytest.raises(ShapeError, match=r"w2 \[E, H, I\] must have shape \[5, 64, 32\]"):
        _experts(x, ids, weights, (w1, w3, w2.transpose(1, 2).contiguous()))
    with pytest.raises(ShapeError, match="weights must have dtype"):
        _experts(x, ids, weights.half(), (w1, w3, w2))
    with pytest.raises(ShapeError, match="act_quant 'fp4'"):
        _experts(x, ids, weights, (w1, w3, w2), act_quant="fp4")
    with pytest.raises(ShapeError, match=r"gemm_out_dtype 'fp8' is not one of \['f32', 'bf16', 'f16'\]"):
        _experts(x, ids, weights, (w1, w3, w2), gemm_out_dtype="fp8")


def test_swiglu_clamps_gate_one_sided_and_up_both_sides() -> None:
    g = torch.tensor([[20.0, -3.0, 0.5, -40.0]])
    v = torch.tensor([[15.0, -12.0, 2.0, 3.0]])
    got = _run(lambda g, v: M.swiglu(g, v, limit=10.0), [_ty(g), _ty(v)], [g, v])["out"]
    want = [_silu(10.0) * 10.0, _silu(-3.0) * -10.0, _silu(0.5) * 2.0, _silu(-40.0) * 3.0]
    torch.testing.assert_close(got, torch.tensor([want]), rtol=1e-6, atol=1e-12)
    out = _run(lambda g, v: M.swiglu(g, v, limit=10.0, out_dtype="bf16"), [_ty(g), _ty(v)], [g, v])["out"]
    assert torch.equal(out, got.bfloat16())
    with pytest.raises(ShapeError, match="must have the same shape"):
        make_graph(lambda g, v: M.swiglu(g, v, limit=1.0), T_((2, 4), "f32"), T_((2, 3), "f32"))
    with pytest.raises(ShapeError, match="limit is 0"):
        make_graph(lambda g, v: M.swiglu(g, v, limit=0), T_((2, 4), "f32"), T_((2, 4), "f32"))


# ---- engram_hash ----

TINY_SPEC = EngramSpec((1, 2), 31, 2, 4, 130, (252, 410), 2)
REAL_SPEC = EngramSpec((1, 14), 16_000_000, 8, 4, 99092, (384006168, 384016682), 2)


def hash_params(spec: EngramSpec, k: int, token_map: np.ndarray, image_token_id: int = -1) -> dict[str, Any]:
    """The params the backbone passes to engram_hash for Engram layer `spec.layer_ids[k]`."""
    layer = engram_primes(spec)[k]
    return dict(
        primes=layer.primes,
        offsets=layer.offsets,
        multipliers=layer.multipliers,
        pad_id=int(token_map[spec.pad_token_id]),
        max_ngram=spec.max_ngram,
        image_token_id=image_token_id,
    )


def _hash(args: list[torch.Tensor], **p: Any) -> torch.Tensor:
    def f(token_ids, positions, seq_ids, seq_start, lookback, token_map):  # type: ignore[no-untyped-def]
        return EG.engram_hash(token_ids, positions, seq_ids, seq_start, lookback, token_map, **p)

    types = [_ty(a, "tokens") for a in args[:3]] + [_ty(a, "seqs") for a in args[3:5]] + [_ty(args[5])]
    return _run(f, types, args)["out"]


def make_step(
    streams: list[np.ndarray],
    chunks: list[tuple[int, int]],
    pads: list[int],
    token_map: np.ndarray,
    history: int,
) -> list[torch.Tensor]:
    """Step operands: chunk s of stream s after pads[s] padding rows (bad ids); lookback newest first."""
    ids, pos, sid, starts, backs = [], [], [], [], []
    for s, (stream, (start, end)) in enumerate(zip(streams, chunks, strict=True)):
        ids += [999_999] * pads[s]
        pos += [7] * pads[s]
        sid += [-1] * pads[s]
        ids += stream[start:end].tolist()
        pos += list(range(start, end))
        sid += [s] * (end - start)
        starts.append(start)
        backs.append([int(stream[start - 1 - j]) if start - 1 - j >= 0 else -1 for j in range(history)])
    i32 = torch.int32
    return [
        torch.tensor(ids, dtype=i32),
        torch.tensor(pos, dtype=i32),
        torch.tensor(sid, dtype=i32),
        torch.tensor(starts, dtype=i32),
        torch.tensor(backs, dtype=i32).reshape(len(streams), history),
        torch.tensor(token_map, dtype=i32),
    ]


def _numpy_rows(stream: np.ndarray, start: int, end: int, token_map, spec, k, image: int = -1):  # type: ignore[no-untyped-def]
    blocked = stream == image
    back = [None if i < 0 or blocked[i] else int(stream[i]) for i in range(start - spec.max_ngram + 1, start)]
    return engram_rows(stream[start:end], range(start, end), back, token_map, spec, k, blocked[start:end])


@pytest.mark.parametrize("case", ["tiny", "real"])
def test_engram_hash_equals_numpy_reference(case: str) -> None:
    spec = TINY_SPEC if case == "tiny" else REAL_SPEC
    rng = np.random.default_rng(5)
    vocab = 256 if case == "tiny" else 129280
    token_map = rng.integers(0, spec.compressed_vocab, size=vocab)
    image = vocab - 2
    streams = [rng.integers(0, vocab, size=n) for n in (12, 9, 20, 3)]
    streams[2][[6, 13]] = image  # image tokens block the n-grams through them
    chunks = [(0, 12), (8, 9), (2, 17), (1, 3)]  # prefill, decode, a middle chunk, a short one
    step = make_step(streams, chunks, [0, 2, 1, 0], token_map, spec.max_ngram - 1)
    for k in range(len(spec.layer_ids)):
        got = _hash(step, **hash_params(spec, k, token_map, image))
        want = [_numpy_rows(streams[0], 0, 12, token_map, spec, k, image)]
        want += [np.zeros((2, spec.rows_per_token), dtype=np.int64)]
        want += [_numpy_rows(streams[1], 8, 9, token_map, spec, k, image)]
        want += [np.zeros((1, spec.rows_per_token), dtype=np.int64)]
        want += [
            _numpy_rows(s, a, b, token_map, spec, k, image)
            for s, (a, b) in zip(streams[2:], chunks[2:], strict=True)
        ]
        assert got.dtype == torch.int64
        assert np.array_equal(got.numpy(), np.concatenate(want)), f"{case} layer {k}"


def test_engram_hash_any_chunking_gives_the_same_rows() -> None:
    rng = np.random.default_rng(8)
    token_map = rng.integers(0, 130, size=256)
    stream = rng.integers(0, 256, size=10)
    p = hash_params(TINY_SPEC, 1, token_map)
    whole = _hash(make_step([stream], [(0, 10)], [0], token_map, 3), **p)
    parts = [
        _hash(make_step([stream], [c], [0], token_map, 3), **p) for c in ((0, 1), (1, 5), (5, 6), (6, 10))
    ]
    assert torch.equal(torch.cat(parts), whole)
    # a -1 lookback (e.g. an image token the runtime blanked) blocks that shift and every larger one
    step = make_step([stream], [(5, 6)], [0], token_map, 3)
    step[4][0, 1] = -1
    blanked = _hash(step, **p)
    assert torch.equal(blanked[0, :2], whole[5, :2])  # order 2 only reads shift 1
    assert not torch.equal(blanked[0, 2:], whole[5, 2:])


def test_engram_hash_all_padding_and_errors() -> None:
    token_map = np.arange(256) % 130
    p = hash_params(TINY_SPEC, 0, token_map)
    step = make_step([np.arange(4)], [(0, 4)], [3], token_map, 3)
    step[2][:] = -1  # every row is padding: zeros, and no garbage id is looked up
    assert torch.equal(_hash(step, **p), torch.zeros(7, 6, dtype=torch.int64))
    step = make_step([np.arange(4)], [(0, 4)], [0], token_map, 3)
    step[0][2] = 300
    with pytest.raises(ExecutionError, match="row 2, shift 0: token id 300 is outside the token map"):
        _hash(step, **p)
    step = make_step([np.arange(4)], [(0, 4)], [0], token_map, 3)
    step[1][3] = 5
    with pytest.raises(ExecutionError, match="row 3 .* expects position 4 of its chunk at row 2"):
        _hash(step, **p)
    step = make_step([np.arange(4)], [(0, 4)], [0], token_map, 3)
    step[2][1] = 1
    with pytest.raises(ExecutionError, match="row 1 has seq_id 1, outside"):
        _hash(step, **p)
    step = make_step([np.arange(4)], [(0, 4)], [0], token_map, 3)
    with pytest.raises(ExecutionError, match="must stay below 2"):
        _hash(step, **{**p, "multipliers": (1 << 56,) * 4})  # token_map holds 129: 129 * 2^56 > 2^63
    with pytest.raises(ShapeError, match="pad_id 2 .* must fit int64"):
        _hash(step, **{**p, "multipliers": (1 << 62,) * 4})


def test_engram_hash_shape_errors() -> None:
    i32 = [T_(("tokens",), "i32")] * 3 + [T_(("seqs",), "i32"), T_(("seqs", 3), "i32"), T_((256,), "i32")]
    p = hash_params(TINY_SPEC, 0, np.arange(256) % 130)

    def f(**q: Any) -> Any:
        return lambda *a: EG.engram_hash(*a, **{**p, **q})

    make_graph(f(), *i32)
    with pytest.raises(ShapeError, match=r"lookback \[S, max_ngram-1\] must have shape \['seqs', 3\]"):
        make_graph(f(), *i32[:4], T_(("seqs", 2), "i32"), i32[5])
    with pytest.raises(ShapeError, match="need 3 orders"):
        make_graph(f(primes=p["primes"][:2]), *i32)
    with pytest.raises(ShapeError, match="multipliers"):
        make_graph(f(multipliers=(1, 3, 5)), *i32)
    with pytest.raises(ShapeError, match="positions must have dtype"):
        make_graph(f(), i32[0], T_(("tokens",), "i64"), *i32[2:])


# ---- gather_dequant_rows ----


def _gather(table, scale, rows, out_dtype="f32"):  # type: ignore[no-untyped-def]
    def f(table, scale, rows):  # type: ignore[no-untyped-def]
        return EG.gather_dequant_rows(table, scale, rows, out_dtype=out_dtype)

    return _run(f, [_ty(table), _ty(scale), _ty(rows, "tokens")], [table, scale, rows])["out"]


def test_gather_dequant_rows_by_hand() -> None:
    values = torch.tensor([[1.5, -2.0] * 32, [0.25, 448.0] * 32, [-3.0, 0.0] * 32])
    table = values.to(torch.float8_e4m3fn)
    exps = torch.tensor([[127, 125], [130, 127], [120, 140]], dtype=torch.uint8)  # 2^(e - 127)
    scale = exps.view(torch.float8_e8m0fnu)
    rows = torch.tensor([[2, 0], [1, 1], [0, 2]], dtype=torch.int64)
    got = _gather(table, scale, rows)
    assert got.shape == (3, 2, 64)
    for t in range(3):
        for j in range(2):
            r = int(rows[t, j])
            want = values[r] * torch.tensor([2.0 ** (int(e) - 127) for e in exps[r]]).repeat_interleave(32)
            assert torch.equal(got[t, j], want)
    assert torch.equal(_gather(table, scale, rows, "bf16"), got.bfloat16())
    assert _gather(table, scale, torch.zeros(0, 2, dtype=torch.int64)).shape == (0, 2, 64)


def test_gather_dequant_rows_matches_codec_and_errors() -> None:
    gen = torch.Generator().manual_seed(4)
    table, scale = fp8_rows_quantize(torch.randn(40, 96, generator=gen))
    rows = torch.randint(0, 40, (5, 6), generator=gen, dtype=torch.int64)
    from dsgraph.platform.cpu.quant import fp8_rows_dequantize

    assert torch.equal(_gather(table, scale, rows), fp8_rows_dequantize(table, scale)[rows])
    rows[1, 2] = 40
    with pytest.raises(ExecutionError, match=r"rows\[1, 2\] = 40 is outside the table \[0, 40\)"):
        _gather(table, scale, rows)
    with pytest.raises(ShapeError, match=r"scale \[R, D/32\] must have shape \[40, 3\]"):
        make_graph(EG.gather_dequant_rows, _ty(table), T_((40, 2), "e8m0"), T_(("t", 6), "i64"))
    with pytest.raises(ShapeError, match="rows must have dtype"):
        make_graph(EG.gather_dequant_rows, _ty(table), _ty(scale), T_(("t", 6), "i32"))


# ---- engram_gate ----


def _gate(x, kv, qw, kw, ids, eps=1e-20, image=254):  # type: ignore[no-untyped-def]
    def f(x, kv, qw, kw, ids):  # type: ignore[no-untyped-def]
        return EG.engram_gate(x, kv, qw, kw, ids, eps=eps, image_token_id=image)

    types = [_ty(x, "tokens"), _ty(kv, "tokens"), _ty(qw), _ty(kw), _ty(ids, "tokens")]
    return _run(f, types, [x, kv, qw, kw, ids])["out"]


def _gate_by_hand(x, kv, qw, kw, ids, eps, image):  # type: ignore[no-untyped-def]
    x64, kv64 = x.double(), kv.double()
    n, h = x.shape[1], x.shape[2]
    out = x64.clone()
    for t in range(x.shape[0]):
        if int(ids[t]) == image or int(ids[t]) < 0:
            continue
        v = kv64[t, n * h :]
        for m in range(n):
            k = kv64[t, m * h : (m + 1) * h]
            xm = x64[t, m]
            d = float((xm * qw[m].double() * kw[m].double() * k).sum())
            d /= (
                math.sqrt(float(xm.pow(2).mean()) + eps)
                * math.sqrt(float(k.pow(2).mean()) + eps)
                * math.sqrt(h)
            )
            g = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(d), 1e-6)), d)))
            out[t, m] = xm + g * v
    return out


@pytest.mark.parametrize("n,h", [(4, 64), (2, 96)])
def test_engram_gate_matches_hand_formula(n: int, h: int) -> None:
    gen = torch.Generator().manual_seed(n * h)
    x = torch.randn(5, n, h, generator=gen)
    kv = torch.randn(5, (n + 1) * h, generator=gen)
    qw, kw = torch.rand(n, h, generator=gen) + 0.5, torch.rand(n, h, generator=gen) + 0.5
    ids = torch.tensor([3, 254, 7, -1, 9], dtype=torch.int32)
    got = _gate(x, kv, qw, kw, ids)
    torch.testing.assert_close(
        got.double(), _gate_by_hand(x, kv, qw, kw, ids, 1e-20, 254), rtol=1e-5, atol=1e-5
    )
    assert torch.equal(got[1], x[1]) and torch.equal(got[3], x[3])  # image and padding rows unchanged
    assert not torch.equal(got[0], x[0])
    xb = x.bfloat16()
    assert _gate(xb, kv, qw.bfloat16(), kw.bfloat16(), ids).dtype == torch.bfloat16


def test_engram_gate_zero_dot_uses_the_floor_not_sign_zero() -> None:
    x = torch.zeros(1, 1, 32)
    x[0, 0, 0] = 1.0
    kv = torch.zeros(1, 64)
    kv[0, 1] = 1.0  # K orthogonal to x: d = +0
    kv[0, 32:] = 2.0
    got = _gate(x, kv, torch.ones(1, 32), torch.ones(1, 32), torch.tensor([5], dtype=torch.int32))
    g = 1 / (1 + math.exp(-1e-3))
    torch.testing.assert_close(got[0, 0], x[0, 0] + g * 2.0)


def test_engram_gate_shape_errors() -> None:
    x, qw = T_(("tokens", 4, 64), "f32"), T_((4, 64), "f32")
    ids = T_(("tokens",), "i32")

    def g(*a: Any) -> Any:
        return EG.engram_gate(*a, eps=1e-20, image_token_id=254)

    make_graph(g, x, T_(("tokens", 320), "f32"), qw, qw, ids)
    with pytest.raises(ShapeError, match=r"kv \[T, \(n\+1\)\*H\] must have shape \['tokens', 320\]"):
        make_graph(g, x, T_(("tokens", 256), "f32"), qw, qw, ids)
    with pytest.raises(ShapeError, match="kv must have dtype"):
        make_graph(g, x, T_(("tokens", 320), "bf16"), qw, qw, ids)
    with pytest.raises(ShapeError, match="token_ids must have dtype"):
        make_graph(g, x, T_(("tokens", 320), "f32"), qw, qw, T_(("tokens",), "i64"))
    with pytest.raises(ShapeError, match=r"kw \[n, H\] must have shape"):
        make_graph(g, x, T_(("tokens", 320), "f32"), qw, T_((64, 4), "f32"), ids)
