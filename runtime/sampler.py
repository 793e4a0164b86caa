"""The sampling step: one lowered `sample` program per (rows, top-logprobs) shape, fed per-row params."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsgraph.graph import TensorType, make_graph
from dsgraph.graph.passes import specialize
from dsgraph.ops import op
from dsgraph.platform.cpu.interpret import run_program
from dsgraph.platform.registry import Program, lower
from dsgraph.runtime.sampling_params import SamplingParams


@dataclass(frozen=True)
class Samples:
    tokens: torch.Tensor  # [outs] i32
    logprobs: torch.Tensor  # [outs] f32, of the chosen token under the processed distribution
    top_logprobs: torch.Tensor  # [outs, K] f32
    top_ids: torch.Tensor  # [outs, K] i32


class Sampler:
    def __init__(self, vocab_size: int, num_top_logprobs: int = 20) -> None:
        self.vocab, self.k = vocab_size, num_top_logprobs
        self.graph = make_graph(
            self._fn,
            TensorType(("outs", vocab_size), "f32"),
            *(TensorType(("outs",), d) for d in ("f32", "f32", "i32", "f32", "i64", "i32")),
            name="sample",
        )
        self.programs: dict[int, Program] = {}

    def _fn(self, logits, temperature, top_p, top_k, min_p, seed, position):  # type: ignore[no-untyped-def]
        token, logprob, top_lp, top_ids = op.sample(
            logits, temperature, top_p, top_k, min_p, seed, position, num_top_logprobs=self.k
        )
        return {"token": token, "logprob": logprob, "top_logprobs": top_lp, "top_ids": top_ids}

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        positions: torch.Tensor,
    ) -> Samples:
        """Row i of `logits` is sampled with params[i], seeds[i] at token position positions[i]."""
        rows = [p.op_row() for p in params]
        args = [
            logits.float(),
            torch.tensor([r[0] for r in rows], dtype=torch.float32),
            torch.tensor([r[1] for r in rows], dtype=torch.float32),
            torch.tensor([r[2] for r in rows], dtype=torch.int32),
            torch.tensor([r[3] for r in rows], dtype=torch.float32),
            torch.tensor(list(seeds), dtype=torch.int64),
            positions.to(torch.int32),
        ]
        n = logits.shape[0]
        if n not in self.programs:
            self.programs[n] = lower(specialize(self.graph, {"outs": n}), "cpu")
        out = run_program(self.programs[n], args)
        return Samples(out["token"], out["logprob"], out["top_logprobs"], out["top_ids"])
