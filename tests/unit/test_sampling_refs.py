"""Shared runner and hand references of the `sample` op tests (test_sampling_op.py, test_sampling_dist.py).
No tests here. The references are plain Python (floats, ints, sorted()), independent of the torch rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import dsgraph.ops  # noqa: F401
from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.ops import op
from dsgraph.platform.cpu.interpret import run_graph

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Rows:
    """Per-row sampling inputs; scalars broadcast over the rows of `logits`."""

    logits: torch.Tensor
    temperature: float | Sequence[float] = 1.0
    top_p: float | Sequence[float] = 1.0
    top_k: int | Sequence[int] = -1
    min_p: float | Sequence[float] = 0.0
    seed: int | Sequence[int] = 0
    position: Sequence[int] | None = None  # default 0..rows-1
    allowed: torch.Tensor | None = None  # [rows, ceil(V/32)] i32

    def tensors(self) -> list[torch.Tensor]:
        n = self.logits.shape[0]

        def column(value: object, dtype: torch.dtype) -> torch.Tensor:
            values = value if isinstance(value, Sequence) else [value] * n
            return torch.tensor(list(values), dtype=dtype).reshape(n)

        position = list(range(n)) if self.position is None else self.position
        args = [
            self.logits.float(),
            column(self.temperature, torch.float32),
            column(self.top_p, torch.float32),
            column(self.top_k, torch.int32),
            column(self.min_p, torch.float32),
            column(self.seed, torch.int64),
            column(position, torch.int32),
        ]
        return args if self.allowed is None else [*args, self.allowed]


def sample_graph(vocab: int, k: int = 0, stream: int = 0, masked: bool = False) -> Graph:
    types = [TensorType(("outs", vocab), "f32")]
    types += [TensorType(("outs",), d) for d in ("f32", "f32", "i32", "f32", "i64", "i32")]
    if masked:
        types.append(TensorType(("outs", -(-vocab // 32)), "i32"))
    return make_graph(lambda *xs: op.sample(*xs, num_top_logprobs=k, stream=stream), *types)


def run_sample(rows: Rows, k: int = 0, stream: int = 0) -> tuple[torch.Tensor, ...]:
    """(token, logprob, top_logprobs, top_ids) of the op on the cpu platform."""
    graph = sample_graph(rows.logits.shape[1], k, stream, rows.allowed is not None)
    out = run_graph(graph, rows.tensors())
    return tuple(out[name] for name in graph.output_names)


def bitmask(allowed: Sequence[Sequence[int]], vocab: int) -> torch.Tensor:
    """[rows, ceil(V/32)] i32 bitmask allowing exactly the listed tokens of each row."""
    words = []
    for tokens in allowed:
        row = [0] * (-(-vocab // 32))
        for t in tokens:
            row[t // 32] |= 1 << (t % 32)
        words.append([w - (1 << 32) if w >= 1 << 31 else w for w in row])
    return torch.tensor(words, dtype=torch.int32)


GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's output function of a 64-bit state (Python ints, explicit 64-bit masks)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def splitmix64(seed: int, count: int) -> list[int]:
    """The first `count` outputs of SplitMix64 seeded with `seed`, stepping the state."""
    state, out = seed & MASK64, []
    for _ in range(count):
        state = (state + GOLDEN) & MASK64
        out.append(mix64(state))
    return out


def uniform_ref(seed: int, position: int, stream: int = 0) -> float:
    """The op's documented draw: SplitMix64 output number n = 4 * position + stream + 1 of `seed` (whose
    state is seed + n * golden), top 53 bits."""
    return (mix64((seed + (4 * position + stream + 1) * GOLDEN) & MASK64) >> 11) / 2.0**53


def kept_ref(
    logits: Sequence[float],
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    allowed: set[int] | None = None,
) -> tuple[list[int], dict[int, float]]:
    """(kept tokens, most likely first; their processed log-probabilities) of one sampling row."""
    x = {t: v / temperature for t, v in enumerate(logits) if allowed is None or t in allowed}
    order = sorted((t for t in x if x[t] > -math.inf), key=lambda t: (-x[t], t))
    if 1 <= top_k < len(logits):
        order = order[:top_k]
    if top_p < 1:
        weights = [math.exp(x[t] - x[order[0]]) for t in order]
        total, mass, keep = sum(weights), 0.0, []
        for t, w in zip(order, weights, strict=True):
            if keep and mass / total >= top_p:
                break
            keep.append(t)
            mass += w
        order = keep
    if min_p > 0:
        order = [t for t in order if math.exp(x[t] - x[order[0]]) >= min_p]
    top = x[order[0]]
    log_total = top + math.log(sum(math.exp(x[t] - top) for t in order))
    return order, {t: x[t] - log_total for t in order}
