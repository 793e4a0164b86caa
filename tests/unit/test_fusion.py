"""Lowering-time fusion (platform/fusion.py, ops/fused.py): which equation pairs merge, when an op's own
output is kept, and that the fused graph computes the same values as the model's."""

from __future__ import annotations

import dataclasses

import torch

from dsgraph.graph import TensorType, make_graph
from dsgraph.graph.serialize import deserialize, serialize
from dsgraph.ops import op
from dsgraph.platform.cpu.interpret import run_program
from dsgraph.platform.cpu.target import PLATFORM as CPU
from dsgraph.platform.fusion import fuse, fuse_qdq
from dsgraph.platform.registry import get_platform, lower

X, W = TensorType((3, 64), "bf16"), TensorType((64,), "bf16")
N, H = 2, 64
HC = dict(sinkhorn_iters=3, eps=1e-6, norm_eps=1e-6)
HC_TYPES = (
    TensorType((3, N, H), "bf16"),  # x
    TensorType((3, H), "bf16"),  # y, a sublayer's output
    TensorType((3, N), "f32"),  # a (the pre-mix)
    TensorType((2 * N + N * N, N * H), "f32"),  # fn
    TensorType((2 * N + N * N,), "f32"),  # base
    TensorType((3,), "f32"),  # scale
    W,  # the norm's weight
)


def _norm_then_qdq(x, w):  # type: ignore[no-untyped-def]
    y = op.rms_norm(x, w, eps=1e-6)
    return {"q": op.act_qdq(y, fmt="fp8_g32", out_dtype="bf16")}


def _norm_read_twice(x, w):  # type: ignore[no-untyped-def]
    y = op.rms_norm(x, w, eps=1e-6)
    return {"q": op.act_qdq(y, fmt="fp8_g32", out_dtype="bf16"), "m": op.act_qdq(y, fmt="mxfp4_g32")}


def _sublayer_boundary(x, y, a, fn, base, scale, w):  # type: ignore[no-untyped-def]
    """The block's pattern: pre-coefficients of x, a sublayer writes back, the next one's coefficients
    and input (collapse with the earlier pre-mix, norm, quantization)."""
    pre, post, comb = op.hc_pre(x, fn, base, scale, **HC)
    x2 = op.hc_expand(y, x, post, comb)
    pre2, post2, comb2 = op.hc_pre(x2, fn, base, scale, **HC)
    u = op.rms_norm(op.hc_collapse(x2, pre, out_dtype="bf16"), w, eps=1e-6)
    return {
        "q": op.act_qdq(u, fmt="fp8_g32", out_dtype="bf16"),
        "u": u,
        "x2": x2,
        "mix": (pre2, post2, comb2),
    }


def _ops(graph) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.op for e in graph.eqns]


def test_an_op_read_only_by_its_qdq_writes_only_q() -> None:
    fused = fuse_qdq(make_graph(_norm_then_qdq, X, W))
    assert _ops(fused) == ["rms_norm_qdq"]
    (eqn,) = fused.eqns
    assert eqn.params.raw is False and len(eqn.outputs) == 1
    assert (eqn.params.eps, eqn.params.qdq_fmt, eqn.params.qdq_dtype) == (1e-6, "fp8_g32", "bf16")
    assert eqn.outputs[0].type == TensorType((3, 64), "bf16")


def test_an_op_read_elsewhere_keeps_its_output_and_one_qdq_folds() -> None:
    graph = make_graph(_norm_read_twice, X, W)
    fused = fuse_qdq(graph)
    assert _ops(fused) == ["rms_norm_qdq", "act_qdq"]
    first, second = fused.eqns
    assert first.params.raw is True and first.outputs[0] == graph.eqns[0].outputs[0]
    assert second.inputs[0] == first.outputs[0] and second.params.fmt == "mxfp4_g32"


def test_qdq_of_an_input_or_an_unfusable_op_stays() -> None:
    graph = make_graph(lambda x: {"q": op.act_qdq(op.cast(x, dtype="f32"), fmt="fp8_g32")}, X)
    assert fuse(graph) is graph
    graph = make_graph(lambda x: {"q": op.act_qdq(x, fmt="fp8_g32")}, X)
    assert fuse(graph) is graph


def test_a_sublayer_boundary_becomes_three_equations() -> None:
    graph = make_graph(_sublayer_boundary, *HC_TYPES)
    assert _ops(graph) == ["hc_pre", "hc_expand", "hc_pre", "hc_collapse", "rms_norm", "act_qdq"]
    fused = fuse(graph)
    assert _ops(fused) == ["hc_pre", "hc_expand_pre", "hc_collapse_norm_qdq"]
    expand_pre, collapse_norm = fused.eqns[1:]
    assert expand_pre.outputs == (graph.eqns[1].outputs[0], *graph.eqns[2].outputs)
    assert collapse_norm.params.raw is True  # u is a graph output too
    assert (collapse_norm.params.out_dtype, collapse_norm.params.eps) == ("bf16", 1e-6)


def test_a_collapse_read_twice_is_not_merged_into_the_norm() -> None:
    def fn(x, a, w):  # type: ignore[no-untyped-def]
        c = op.hc_collapse(x, a, out_dtype="bf16")
        return {"u": op.rms_norm(c, w, eps=1e-6), "c": c}

    graph = make_graph(fn, HC_TYPES[0], HC_TYPES[2], W)
    assert fuse(graph) is graph


def test_an_encoding_read_only_by_its_cache_write_is_merged_into_it() -> None:
    ring, values = TensorType((2, 4, 66), "u8"), TensorType((3, 64), "bf16")
    i32 = TensorType((3,), "i32")

    def fn(ring, values, positions, seq_ids, seq_slot, seq_end):  # type: ignore[no-untyped-def]
        entries = op.cache_encode(values, fmt="fp8_g32")
        return {"ring": op.swa_write(ring, entries, positions, seq_ids, seq_slot, seq_end)}

    types = (ring, values, i32, i32, TensorType((2,), "i32"), TensorType((2,), "i32"))
    graph = make_graph(fn, *types)
    fused = fuse(graph)
    assert _ops(fused) == ["encode_swa_write"]
    (eqn,) = fused.eqns
    assert eqn.params.fmt == "fp8_g32" and eqn.inputs[1] == graph.inputs[1]
    assert eqn.outputs == graph.eqns[1].outputs


ROPE = dict(rope_dim=16, theta=10000.0)
POS = TensorType((3,), "i32")


def _kv_row(x, w, positions):  # type: ignore[no-untyped-def]
    """A K(=V) row's chain: norm, rope of the normalized row, its FP8 quantization."""
    kv = op.rope(op.rms_norm(x, w, eps=1e-6), positions, **ROPE)
    return {"kv": kv, "q": op.act_qdq(kv, fmt="fp8_g32")}


def _norm_read_by_rope_and_more(x, w, positions):  # type: ignore[no-untyped-def]
    y = op.rms_norm(x, w, eps=1e-6)
    return {"r": op.rope(y, positions, **ROPE), "y": y}


def test_a_norm_read_only_by_a_rope_is_merged_into_it_and_its_qdq_folds() -> None:
    graph = make_graph(_kv_row, X, W, POS)
    fused = fuse(graph)
    assert _ops(fused) == ["rms_norm_rope_qdq"]
    (eqn,) = fused.eqns
    assert eqn.inputs == graph.inputs and eqn.outputs == (graph.eqns[1].outputs[0], graph.eqns[2].outputs[0])
    p = eqn.params
    assert (p.eps, p.rope_dim, p.theta, p.qdq_fmt, p.raw) == (1e-6, 16, 10000.0, "fp8_g32", True)
    assert deserialize(serialize(fused)) == fused


def test_a_norm_read_elsewhere_is_not_merged_into_its_rope() -> None:
    graph = make_graph(_norm_read_by_rope_and_more, X, W, POS)
    assert fuse(graph) is graph


W8, S8 = TensorType((32, 64), "f8e4m3"), TensorType((1, 2), "e8m0")  # an FP8 weight and its block scales
FP8 = dict(weight_format="fp8_block32", out_dtype="bf16")


def _three_projections(x, w1, s1, w2, s2, w3, s3, dense):  # type: ignore[no-untyped-def]
    """Three FP8 linears of one activation (the first two pair, the third stays), a dense one of it, and
    one with other params."""
    return {
        "a": op.linear(x, w1, s1, **FP8),
        "b": op.linear(x, w2, s2, **FP8),
        "c": op.linear(x, w3, s3, **FP8),
        "d": op.linear(x, dense, out_dtype="f32"),
        "e": op.linear(x, w1, s1, weight_format="fp8_block32", out_dtype="f32"),
    }


def test_two_fp8_linears_of_one_activation_become_a_pair() -> None:
    graph = make_graph(_three_projections, X, W8, S8, W8, S8, W8, S8, TensorType((16, 64), "bf16"))
    fused = fuse(graph)
    assert _ops(fused) == ["linear_pair", "linear", "linear", "linear"]
    pair = fused.eqns[0]
    assert pair.inputs == graph.inputs[:5] and pair.outputs == (
        graph.eqns[0].outputs[0],
        graph.eqns[1].outputs[0],
    )
    assert pair.params == graph.eqns[0].params
    assert deserialize(serialize(fused)) == fused


def _same_results(graph, args) -> None:  # type: ignore[no-untyped-def]
    fusing = dataclasses.replace(CPU, fuse=True)
    plain, fused = lower(graph, CPU), lower(graph, fusing)
    assert len(fused.steps) < len(plain.steps)
    want, got = run_program(plain, args), run_program(fused, args)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_the_fused_graphs_compute_the_same_values() -> None:
    gen = torch.Generator().manual_seed(0)
    args = [(torch.randn(3, 64, generator=gen) * 3).bfloat16(), torch.rand(64, generator=gen).bfloat16()]
    for fn in (_norm_then_qdq, _norm_read_twice):
        _same_results(make_graph(fn, X, W), args)
    args = [(torch.randn(t.shape, generator=gen)).to(torch.bfloat16 if t.dtype == "bf16" else torch.float32)
            for t in HC_TYPES]  # fmt: skip
    args[2] = args[2].abs() + 0.1
    _same_results(make_graph(_sublayer_boundary, *HC_TYPES), args)
    args = [(torch.randn(3, 64, generator=gen) * 3).bfloat16(), torch.rand(64, generator=gen).bfloat16()]
    _same_results(make_graph(_kv_row, X, W, POS), [*args, torch.tensor([0, 9, 70000], dtype=torch.int32)])
    weights = []
    for _ in range(3):
        w = torch.randn(32, 64, generator=gen) * 0.1
        weights += [
            w.to(torch.float8_e4m3fn),
            torch.full((1, 2), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu),
        ]
    x = (torch.randn(3, 64, generator=gen) * 3).bfloat16()
    types = (X, W8, S8, W8, S8, W8, S8, TensorType((16, 64), "bf16"))
    _same_results(make_graph(_three_projections, *types), [x, *weights, torch.randn(16, 64).bfloat16()])


def test_the_cuda_platform_fuses_and_the_cpu_platform_does_not() -> None:
    assert get_platform("cuda").fuse and not get_platform("cpu").fuse
    assert _ops(lower(make_graph(_norm_then_qdq, X, W), "cpu").graph) == ["rms_norm", "act_qdq"]
    assert _ops(lower(make_graph(_norm_then_qdq, X, W), "cuda").graph) == ["rms_norm_qdq"]


def test_a_fused_graph_serializes() -> None:
    fused = fuse(make_graph(_sublayer_boundary, *HC_TYPES))
    assert deserialize(serialize(fused)) == fused
