"""Small graphs whose printed forms are kept as golden files."""

from __future__ import annotations

from collections.abc import Callable

import dsgraph.ops  # noqa: F401
from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.graph.passes import cse, dce, specialize
from dsgraph.ops import core as C
from dsgraph.ops import nn as N
from dsgraph.ops import shape as S


def mlp(x, norm_w, w_up, w_down):  # type: ignore[no-untyped-def]
    h = N.rms_norm(x, norm_w, eps=1e-20)
    up = N.linear(h, w_up, out_dtype="f32")
    return x + N.linear(C.silu(up) * up, w_down, out_dtype="bf16")


def attention_scores(q, k):  # type: ignore[no-untyped-def]
    qh = S.transpose(S.reshape(q, shape=("tokens", 2, 8)), perm=(1, 0, 2))  # [2, tokens, 8]
    scores = qh @ S.transpose(k, perm=(1, 0)) * 0.125  # [2, tokens, keys]
    return {"probs": N.softmax(scores, axis=-1), "best": C.reduce_max(scores, axes=(2,))}


def _mlp() -> Graph:
    f32, bf16 = "f32", "bf16"
    return make_graph(
        mlp,
        TensorType(("tokens", 32), bf16),
        TensorType((32,), f32),
        TensorType((64, 32), bf16),
        TensorType((32, 64), bf16),
    )


def _attention() -> Graph:
    return make_graph(attention_scores, TensorType(("tokens", 16), "f32"), TensorType(("keys", 8), "f32"))


GOLDEN: dict[str, Callable[[], Graph]] = {
    "mlp_traced": _mlp,
    "mlp_bucket4": lambda: specialize(dce(cse(_mlp())), {"tokens": 4}),
    "attention_traced": _attention,
    "attention_bucket": lambda: specialize(_attention(), {"tokens": 2, "keys": 5}),
}
