"""The DSpark drafter in the runtime: the draft graph lowered once per bucket of sequences, run over the
session's context rings (`dspark.ring{s}`, written by the target step of a session built with
`build_model(..., dspark=True)`), and the pool of draft log-probabilities the verification reads.

A draft pass drafts K = dspark_block_size tokens for each sequence from its anchor (the newest token, not
yet run through the target) at position a; sequences are padded to the next power of two (at most
log2(max_num_seqs) + 1 programs), and each lowering counts in the session's `programs_built`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsgraph.graph import Graph
from dsgraph.graph.passes import specialize
from dsgraph.models.deepseek_v41.dspark import DRAFT_STREAM, trace_draft
from dsgraph.models.deepseek_v41.dspark_context import is_context_weight, is_draft_weight
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest, draft_inputs
from dsgraph.models.deepseek_v41.weights import weight_types
from dsgraph.platform.cpu.interpret import run_program
from dsgraph.platform.registry import Program, lower
from dsgraph.runtime.step_padding import bucket_size

__all__ = ["DraftOutput", "DraftRunner", "has_dspark_stages", "target_weights"]


def has_dspark_stages(weights: Mapping[str, torch.Tensor], num_stages: int) -> bool:
    """Whether a checkpoint holds every DSpark stage the config declares (`mtp.{s}.*`)."""
    return num_stages > 0 and all(any(k.startswith(f"mtp.{s}.") for k in weights) for s in range(num_stages))


def target_weights(weights: Mapping[str, torch.Tensor], dspark: bool) -> dict[str, torch.Tensor]:
    """The weights the target step reads: the backbone, plus the DSpark context weights with `dspark`."""
    return {k: v for k, v in weights.items() if not k.startswith("mtp.") or (dspark and is_context_weight(k))}


@dataclass(frozen=True)
class DraftOutput:
    tokens: torch.Tensor  # [n, K] i32
    logprobs: torch.Tensor  # [n, K, V] f32, the processed distribution each draft was drawn from
    confidence: torch.Tensor  # [n, K] f32, conditional acceptance probabilities


class DraftRunner:
    """Draft passes of one session: `run(requests)` drafts for each request (a `DraftRequest`)."""

    def __init__(
        self, session: Any, weights: Mapping[str, torch.Tensor], *, stream: int = DRAFT_STREAM
    ) -> None:
        model = session.model
        if not model.dspark:
            raise ValueError("DraftRunner: the session's model was built without dspark=True")
        self.session, self.text = session, model.cfg.text
        draft = {k: v for k, v in weights.items() if is_draft_weight(k)}
        self.weights = {f"weights.{k}": v.to(session.device) for k, v in draft.items()}
        self.graph: Graph = trace_draft(model, weight_types(draft, backbone_only=False), stream=stream)
        self.programs: dict[int, Program] = {}
        self.device_programs: dict[int, Any] = {}
        self.block = self.text.dspark_block_size

    def _program(self, seqs: int) -> Program:
        if seqs not in self.programs:
            sizes = {"slots": self.session.cache_sizes.num_slots, "seqs": seqs, "tokens": seqs * self.block}
            self.programs[seqs] = lower(specialize(self.graph, sizes), self.session.platform)
            self.session.programs_built += 1  # a draft bucket counts like a target bucket
        return self.programs[seqs]

    def run(self, requests: Sequence[DraftRequest]) -> DraftOutput:
        n = len(requests)
        seqs = bucket_size(n)
        inputs = draft_inputs(self.text, requests, seqs)
        rings = {f"caches.{k}": v for k, v in self.session.caches.items() if k.startswith("dspark.")}
        args = {**self.weights, **rings}
        args.update({f"step.{k}": v.to(self.session.device) for k, v in inputs.items()})
        program = self._program(seqs)
        if self.session.on_device:  # eager on the device (not captured): the draft is one pass per step
            from dsgraph.platform.cuda.execute import DeviceProgram

            if seqs not in self.device_programs:
                self.device_programs[seqs] = DeviceProgram(program, self.session.device)
            out = self.device_programs[seqs].run(args)
        else:
            out = run_program(program, args)
        # tokens and confidences go to the host (the scheduler plans with them); log-probs stay in the pool
        return DraftOutput(
            out["draft_tokens"][:n].cpu(), out["draft_logprobs"][:n], out["confidence"][:n].cpu()
        )
