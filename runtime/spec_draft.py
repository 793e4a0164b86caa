"""The drafter in the runtime: the model's draft graph (`Drafter.trace_draft`: V4.1's DSpark stages, V4's
MTP layer) lowered once per bucket of sequences, run over the caches it reads (written by the target step
of a session built with `build(..., dspark=True)`: V4.1's context rings `dspark.ring{s}`, V4's
`mtp.hidden` and `mtp.swa`), and the pool of draft log-probabilities the verification reads.

A draft pass drafts K = `model.num_draft_tokens` tokens for each sequence from its anchor (the newest
token, not yet run through the target) at position a; sequences are padded to the next power of two (at
most log2(max_num_seqs) + 1 programs), and each lowering counts in the session's `programs_built`.

On the cuda platform with the session's `capture` flag, each bucket's program is captured once
(`platform/cuda/capture.py`: static input buffers, one host-to-device copy per dtype, an eager warm-up
over an all-padding pass; `draft_captures` counts captures) and replayed every pass. The draft graph
writes no cache, so capturing its padding pass changes nothing. The tokens and confidences the scheduler
needs come to the host in one device-to-host copy (packed as i32 bits); the log-probs stay on the device
as a view of the bucket's static buffer, valid until the next pass of that bucket (the engine copies them
into its pool at once). With `capture=False` the pass runs eagerly on the same padded shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsgraph.graph import Graph
from dsgraph.graph.passes import optimize, specialize
from dsgraph.models.interface import DRAFT_STREAM, DraftRequest, weight_types
from dsgraph.platform.registry import BucketRunner, Program, lower, make_runner
from dsgraph.runtime.replay import replay_table
from dsgraph.runtime.step_padding import bucket_size

__all__ = ["DraftOutput", "DraftRunner", "target_weights"]


def target_weights(model: Any, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights the target step reads: the backbone, plus the drafter's context weights when the
    model was built to draft (`model.dspark`)."""
    if not model.dspark:
        return {k: v for k, v in weights.items() if not k.startswith("mtp.")}
    return {k: v for k, v in weights.items() if not k.startswith("mtp.") or model.is_context_weight(k)}


@dataclass(frozen=True)
class DraftOutput:
    tokens: torch.Tensor  # [n, K] i32 on the host
    # [n, K, V] f32 on the session's device, the processed distribution each draft was drawn from; on the
    # captured path a view of the bucket's static buffer (overwritten by the bucket's next pass)
    logprobs: torch.Tensor
    confidence: torch.Tensor  # [n, K] f32 on the host, conditional acceptance probabilities


class DraftRunner:
    """Draft passes of one session: `run(requests)` drafts for each request (a `DraftRequest`).
    `capture`: capture each bucket on the cuda platform (default: the session's flag)."""

    def __init__(
        self,
        session: Any,
        weights: Mapping[str, torch.Tensor],
        *,
        stream: int = DRAFT_STREAM,
        capture: bool | None = None,
    ) -> None:
        model = session.model
        if not model.dspark:
            raise ValueError("DraftRunner: the session's model was built without dspark=True")
        self.session, self.text = session, model.cfg.text
        draft = {k: v for k, v in weights.items() if model.is_draft_weight(k)}
        # the weights both graphs read (embedding, head, shared stage weights) are the session's device
        # copies, not second ones
        held, device = session.weights, session.device
        self.weights = {f"weights.{k}": held.get(f"weights.{k}", v).to(device) for k, v in draft.items()}
        self.bundle = getattr(session, "bundle", None)  # a bundle's session: its draft graphs are read
        if self.bundle is not None:
            self.graph: Graph = self.bundle.graph("draft")
        else:
            self.graph = optimize(model.trace_draft(weight_types(draft, backbone_only=False), stream=stream))
        self.programs: dict[int, Program] = {}
        self.block = model.num_draft_tokens
        # the caches the draft graph reads (written by the target step): V4.1's context rings, V4's MTP rings
        self.cache_names = [
            n.removeprefix("caches.") for n in self.graph.input_names if n.startswith("caches.")
        ]
        self.capture = bool(getattr(session, "capture", True) if capture is None else capture)
        # the platform's runner of the draft buckets (its captures share one memory pool)
        cuda = getattr(session, "cuda", None)  # the session's EngineConfig.cuda: the same side stream rule
        self.runner: BucketRunner = make_runner(
            session.platform, device, replay_table(), side_stream=None if cuda is None else cuda.side_stream
        )
        self.packed: dict[int, torch.Tensor] = {}  # seqs bucket -> [2, seqs, K] i32: tokens, confidences

    def _program(self, seqs: int) -> Program:
        if seqs not in self.programs and self.bundle is not None:
            self.programs[seqs] = self.bundle.program("draft", f"seqs{seqs}", self.session.platform)
        if seqs not in self.programs:
            sizes = {"slots": self.session.cache_sizes.num_slots, "seqs": seqs, "tokens": seqs * self.block}
            self.programs[seqs] = lower(specialize(self.graph, sizes), self.session.platform)
            self.session.programs_built += 1  # a draft bucket counts like a target bucket
        return self.programs[seqs]

    def _fixed(self) -> dict[str, torch.Tensor]:
        """Weights and the caches the draft reads, by graph input name (persistent device tensors)."""
        return {**self.weights, **{f"caches.{k}": self.session.caches[k] for k in self.cache_names}}

    def run(self, requests: Sequence[DraftRequest], *, capture: bool | None = None) -> DraftOutput:
        """Draft for `requests`; `capture` overrides the runner's flag for this pass (benchmarks)."""
        n = len(requests)
        seqs = bucket_size(n)
        inputs = {f"step.{k}": v for k, v in self.session.model.draft_inputs(requests, seqs).items()}
        out = self.runner.run(
            seqs,
            lambda: self._program(seqs),
            self._fixed(),
            inputs,
            capture=self.capture if capture is None else capture,
            padding=lambda: {f"step.{k}": v for k, v in self.session.model.draft_inputs([], seqs).items()},
        )
        if seqs not in self.packed:
            self.packed[seqs] = torch.zeros(
                (2, seqs, self.block), dtype=torch.int32, device=self.runner.device
            )
        packed = self.packed[seqs]
        # tokens and confidences go to the host (the scheduler plans with them) in one device-to-host copy,
        # the confidences as their i32 bit patterns; log-probs stay on the device (the engine's pool)
        packed[0].copy_(out["draft_tokens"])
        packed[1].copy_(out["confidence"].view(torch.int32))
        host = packed.cpu()  # synchronises
        return DraftOutput(host[0, :n], out["draft_logprobs"][:n], host[1, :n].view(torch.float32))

    @property
    def captured(self) -> dict[Any, Any]:
        """Bucket of sequences -> its capture (the runner's)."""
        return self.runner.captured

    @property
    def draft_captures(self) -> int:
        return self.runner.captures

    @property
    def last_captured(self) -> bool:
        """Whether the last pass recorded its bucket (its time includes that)."""
        return self.runner.last_captured

    def as_text(self) -> str:
        """Each captured bucket's graphs and eager steps (which rules could not be captured, and why)."""
        return "".join(self.captured[s].as_text() for s in sorted(self.captured))
