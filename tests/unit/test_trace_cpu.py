"""Tracing a function and running it on the cpu platform equals running it eagerly in torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dsgraph.ops  # noqa: F401
from dsgraph.graph import TensorType, make_graph, verify
from dsgraph.graph.passes import cse, dce, specialize
from dsgraph.ops import core as C
from dsgraph.ops import nn as N
from dsgraph.ops import shape as S
from dsgraph.platform.cpu.interpret import ExecutionError, run_graph


def block(x, w, bias, scale):  # type: ignore[no-untyped-def]
    h = N.rms_norm(x, w, eps=1e-6)  # [tokens, 16]
    heads = S.reshape(h, shape=("tokens", 4, 4))
    probs = N.softmax(heads * scale, axis=-1)  # scale [4, 1] broadcasts over tokens and the last dim
    mixed = S.reshape(probs, shape=("tokens", 16)) + bias  # bias [16]
    gate = C.sigmoid(C.reduce_mean(mixed, axes=(1,), keepdims=True))  # [tokens, 1]
    return {"y": C.where(C.less(mixed, gate), mixed * gate, C.maximum(mixed, gate)), "gate": gate}


def block_eager(x, w, bias, scale):  # type: ignore[no-untyped-def]
    h = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    probs = torch.softmax(h.reshape(-1, 4, 4) * scale, dim=-1)
    mixed = probs.reshape(-1, 16) + bias
    gate = torch.sigmoid(mixed.mean(1, keepdim=True))
    return {"y": torch.where(mixed < gate, mixed * gate, torch.maximum(mixed, gate)), "gate": gate}


TYPES = (
    TensorType(("tokens", 16), "f32"),
    TensorType((16,), "f32"),
    TensorType((16,), "f32"),
    TensorType((4, 1), "f32"),
)


@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_symbolic_graph_matches_eager(tokens: int) -> None:
    g = verify(make_graph(block, *TYPES))
    gen = torch.Generator().manual_seed(tokens)
    args = [torch.randn(tokens, 16, generator=gen), torch.randn(16, generator=gen)]
    args += [torch.randn(16, generator=gen), torch.randn(4, 1, generator=gen)]
    got = run_graph(g, args)
    want = block_eager(*args)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-6)
    # the optimized and specialized graphs compute the same values
    gs = verify(specialize(dce(cse(g)), {"tokens": tokens}))
    for name, value in run_graph(gs, args).items():
        assert torch.equal(value, got[name])


def test_bf16_linear_accumulates_in_f32_row_by_row() -> None:
    def f(x, w):  # type: ignore[no-untyped-def]
        return N.linear(x, w, out_dtype="f32")

    g = make_graph(f, TensorType(("tokens", 64), "bf16"), TensorType((8, 64), "bf16"))
    x, w = torch.randn(5, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    got = run_graph(g, [x, w])["out"]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x.float(), w.float()), rtol=1e-6, atol=1e-6)
    # batch invariant: each row equals the same row computed alone
    for i in range(x.shape[0]):
        assert torch.equal(run_graph(g, [x[i : i + 1], w])["out"][0], got[i])


def test_matmul_concat_slice_gather() -> None:
    def f(table, idx, m):  # type: ignore[no-untyped-def]
        rows = S.gather_rows(table, idx)  # [tokens, 6]
        both = S.concat(rows, S.slice_(rows, axis=1, start=2, stop=5), axis=1)  # [tokens, 9]
        return S.transpose(both @ m, perm=(1, 0))

    g = make_graph(f, TensorType((10, 6), "f32"), TensorType(("tokens",), "i32"), TensorType((9, 2), "f32"))
    table, idx, m = torch.randn(10, 6), torch.tensor([3, 0, 9, 3], dtype=torch.int32), torch.randn(9, 2)
    rows = table[idx.long()]
    want = (torch.cat([rows, rows[:, 2:5]], 1) @ m).T
    torch.testing.assert_close(run_graph(g, [table, idx, m])["out"], want)
    with pytest.raises(ExecutionError, match=r"eqn 0 .*gather_rows.*index 10 outside \[0, 10\)"):
        run_graph(g, [table, torch.tensor([10], dtype=torch.int32), m])


def test_inputs_are_checked_by_name_and_dim() -> None:
    g = make_graph(block, *TYPES)
    args = [torch.randn(3, 16), torch.randn(16), torch.randn(16), torch.randn(4, 1)]
    with pytest.raises(ExecutionError, match=r"input w: axis 0 is 8, expected 16"):
        run_graph(g, [args[0], torch.randn(8), args[2], args[3]])
    with pytest.raises(ExecutionError, match="input x: expected f32"):
        run_graph(g, [args[0].double(), *args[1:]])
    with pytest.raises(ExecutionError, match=r"missing inputs \['scale'\]"):
        run_graph(g, {"x": args[0], "w": args[1], "bias": args[2]})


def test_symbolic_dim_must_bind_consistently() -> None:
    def f(a, b):  # type: ignore[no-untyped-def]
        return C.reduce_sum(a, axes=(1,)) + C.reduce_sum(b, axes=(1,))

    g = make_graph(f, TensorType(("tokens", 2), "f32"), TensorType(("tokens", 3), "f32"))
    with pytest.raises(ExecutionError, match=r"input b: tokens \(axis 0\) is 4, expected 5"):
        run_graph(g, [torch.randn(5, 2), torch.randn(4, 3)])
