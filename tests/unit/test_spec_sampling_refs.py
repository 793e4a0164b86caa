"""Shared runner and plain-Python reference of the `spec_verify` op tests (test_spec_sampling*.py).
No tests here. The reference uses floats, ints and sorted() (with test_sampling_refs' processing and
uniforms), independent of the torch rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import dsgraph.ops  # noqa: F401
from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.ops import op
from dsgraph.platform.cpu.interpret import run_graph
from tests.unit.test_sampling_refs import kept_ref, uniform_ref


@dataclass(frozen=True)
class Seq:
    """One sequence of a verify step: rows [anchor, d_0 .. d_{k-1}], the last one the bonus row."""

    logits: torch.Tensor  # [L, V] target logits of the rows
    drafts: Sequence[int]  # L - 1 draft tokens
    draft_logprobs: torch.Tensor | None = None  # [L - 1, V]; None: uniform (unused by greedy rows)
    position: int = 0  # position decided at row 0 (anchor position + 1)
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    allowed: torch.Tensor | None = None  # [L, ceil(V/32)] i32

    @property
    def rows(self) -> int:
        return self.logits.shape[0]


@dataclass(frozen=True)
class Outcome:
    num_accepted: int
    tokens: list[int] = field(default_factory=list)  # the emitted tokens (num_accepted + 1)
    logprobs: list[float] = field(default_factory=list)


def verify_graph(vocab: int, masked: bool = False) -> Graph:
    row = TensorType(("outs",), "f32")
    types = [
        TensorType(("outs", vocab), "f32"),
        TensorType(("outs",), "i32"),
        TensorType(("outs", vocab), "f32"),
    ]
    types += [
        row,
        row,
        TensorType(("outs",), "i32"),
        row,
        TensorType(("outs",), "i64"),
        TensorType(("outs",), "i32"),
    ]
    types += [TensorType(("seqs",), "i32")] * 2
    if masked:
        types.append(TensorType(("outs", -(-vocab // 32)), "i32"))
    return make_graph(lambda *xs: op.spec_verify(*xs), *types)


def verify_args(seqs: Sequence[Seq], pad: Sequence[int] = (), masked: bool = False) -> list[torch.Tensor]:
    """Flat operands of `seqs` in order; pad[i] padding rows (random logits, no sequence) go before seq i."""
    vocab = seqs[0].logits.shape[1]
    gen = torch.Generator().manual_seed(len(pad) * 7 + sum(pad))
    cols: dict[str, list] = {
        k: [] for k in ("logits", "draft", "dlp", "t", "p", "k", "m", "seed", "pos", "al")
    }
    starts, lens = [], []
    for i, s in enumerate(seqs):
        extra = pad[i] if i < len(pad) else 0
        cols["logits"] += list(torch.randn(extra, vocab, generator=gen)) + list(s.logits.float())
        cols["draft"] += [0] * extra + list(s.drafts) + [-1]
        dlp = s.draft_logprobs if s.draft_logprobs is not None else torch.zeros(s.rows - 1, vocab)
        cols["dlp"] += [torch.zeros(vocab)] * extra + list(dlp.float()) + [torch.zeros(vocab)]
        for key, value in (
            ("t", s.temperature),
            ("p", s.top_p),
            ("k", s.top_k),
            ("m", s.min_p),
            ("seed", s.seed),
        ):
            cols[key] += [value] * (extra + s.rows)
        cols["pos"] += [0] * extra + [s.position + j for j in range(s.rows)]
        if masked:
            words = -(-vocab // 32)
            al = s.allowed if s.allowed is not None else torch.full((s.rows, words), -1, dtype=torch.int32)
            cols["al"] += [torch.full((words,), -1, dtype=torch.int32)] * extra + list(al)
        starts.append(len(cols["draft"]) - s.rows)
        lens.append(s.rows)
    args = [
        torch.stack(cols["logits"]),
        torch.tensor(cols["draft"], dtype=torch.int32),
        torch.stack(cols["dlp"]),
        torch.tensor(cols["t"], dtype=torch.float32),
        torch.tensor(cols["p"], dtype=torch.float32),
        torch.tensor(cols["k"], dtype=torch.int32),
        torch.tensor(cols["m"], dtype=torch.float32),
        torch.tensor(cols["seed"], dtype=torch.int64),
        torch.tensor(cols["pos"], dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32),
    ]
    return [*args, torch.stack(cols["al"])] if masked else args


def run_verify(seqs: Sequence[Seq], pad: Sequence[int] = (), masked: bool = False) -> list[Outcome]:
    """Each sequence's outcome from one run of the op on the cpu platform."""
    args = verify_args(seqs, pad, masked)
    out = run_graph(verify_graph(seqs[0].logits.shape[1], masked), args)
    num, token, logprob = (out[n] for n in verify_graph(1).output_names)
    outcomes = []
    for s, (start, n) in enumerate(zip(args[9].tolist(), num.tolist(), strict=True)):
        emitted = slice(start, start + n + 1)
        assert token[start + n + 1 : start + seqs[s].rows].eq(-1).all(), "rows after the stop hold -1"
        outcomes.append(Outcome(n, token[emitted].tolist(), logprob[emitted].tolist()))
    return outcomes


def draw_ref(order: Sequence[int], weights: Sequence[float], u: float) -> int:
    """Inverse CDF: the first token of `order` whose cumulative weight exceeds u * the total."""
    total, mass = sum(weights), 0.0
    for t, w in zip(order, weights, strict=True):
        mass += w
        if mass > u * total:
            return t
    raise AssertionError("u must be < 1 and the total positive")


def verify_row_ref(
    logits: Sequence[float],
    draft: int,
    draft_probs: Sequence[float],
    temperature: float,
    seed: int,
    position: int,
) -> tuple[bool, int]:
    """(accepted, token emitted on rejection) of one sampled draft row without truncation."""
    kept, logprobs = kept_ref(logits, temperature)
    p_t = [math.exp(logprobs[t]) if t in logprobs else 0.0 for t in range(len(logits))]
    if uniform_ref(seed, position, 1) * draft_probs[draft] < p_t[draft]:
        return True, draft
    residual = [max(0.0, p_t[t] - draft_probs[t]) for t in kept]
    return False, draw_ref(kept, residual, uniform_ref(seed, position, 2))
