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

A pass whose requests are all greedy runs the graph's greedy variant (`trace_draft(..., greedy=True)`,
its own programs and captures: key `(seqs, "greedy")`): the same tokens and confidences, drawn by one
argmax per slot instead of the full processing's sorts of the vocabulary, and no log-probabilities
(`DraftOutput.logprobs` None: verification never reads a greedy row's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dsgraph.graph import Graph
from dsgraph.graph.passes import optimize, specialize
from dsgraph.models.interface import DRAFT_STREAM, DraftRequest, weight_types
from dsgraph.ops.sampling import GREEDY_BELOW
from dsgraph.platform.registry import BucketRunner, Program, lower, make_runner
from dsgraph.runtime.replay import replay_table
from dsgraph.runtime.step_padding import bucket_size

__all__ = ["DraftOutput", "DraftRunner", "bundle_kind", "target_weights"]


def bundle_kind(greedy: bool) -> str:
    """A bundle's step kind of the draft graph's variant."""
    return "draft_greedy" if greedy else "draft"


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
    # captured path a view of the bucket's static buffer (overwritten by the bucket's next pass). None for
    # a pass of greedy requests only (the greedy variant computes none)
    logprobs: torch.Tensor | None
    confidence: torch.Tensor  # [n, K] f32 on the host, conditional acceptance probabilities


class DraftRunner:
    """Draft passes of one session: `run(requests)` drafts for each request (a `DraftRequest`).
    `capture`: capture each bucket on the cuda platform (default: the session's flag). `greedy_variant`
    False runs every pass through the full graph (to compare the variants)."""

    def __init__(
        self,
        session: Any,
        weights: Mapping[str, torch.Tensor],
        *,
        stream: int = DRAFT_STREAM,
        capture: bool | None = None,
        greedy_variant: bool = True,
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
        self._types, self._stream = weight_types(draft, backbone_only=False), stream
        # the greedy variant, unless turned off or absent (a bundle compiled before it has none)
        at_hand = self.bundle is None or self.bundle.has_kind(bundle_kind(True))
        self.greedy_enabled = greedy_variant and at_hand
        self.graphs: dict[bool, Graph] = {}  # greedy variant? -> its graph, traced when first needed
        self.graph: Graph = self._graph(False)
        self.programs: dict[Any, Program] = {}
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

    def _graph(self, greedy: bool) -> Graph:
        if greedy not in self.graphs:
            if self.bundle is not None:
                self.graphs[greedy] = self.bundle.graph(bundle_kind(greedy))
            else:
                traced = self.session.model.trace_draft(self._types, stream=self._stream, greedy=greedy)
                self.graphs[greedy] = optimize(traced)
        return self.graphs[greedy]

    def greedy_variant(self, requests: Sequence[DraftRequest]) -> bool:
        """Whether a pass of `requests` runs the greedy variant: every request greedy (as the `sample` op
        sees its f32 temperature) and the variant enabled."""
        return self.greedy_enabled and all(np.float32(r.temperature) < GREEDY_BELOW for r in requests)

    def probe_requests(self, n: int, greedy: bool) -> list[DraftRequest]:
        """n requests from position 0 of slots 0.. that run the greedy variant or the full graph (what
        profiling and bundle warm-up time and capture)."""
        slots = self.session.cache_sizes.num_slots
        return [DraftRequest(0, 0, i % slots, temperature=0.0 if greedy else 1.0) for i in range(n)]

    @staticmethod
    def key(seqs: int, greedy: bool) -> Any:
        """The runner's key of a bucket: the sequence count, tagged for the greedy variant."""
        return (seqs, "greedy") if greedy else seqs

    def _program(self, seqs: int, greedy: bool = False) -> Program:
        key, platform = self.key(seqs, greedy), self.session.platform
        if key not in self.programs and self.bundle is not None:
            self.programs[key] = self.bundle.program(bundle_kind(greedy), f"seqs{seqs}", platform)
        if key not in self.programs:
            sizes = {"slots": self.session.cache_sizes.num_slots, "seqs": seqs, "tokens": seqs * self.block}
            self.programs[key] = lower(specialize(self._graph(greedy), sizes), platform)
            self.session.programs_built += 1  # a draft bucket counts like a target bucket
        return self.programs[key]

    def _fixed(self) -> dict[str, torch.Tensor]:
        """Weights and the caches the draft reads, by graph input name (persistent device tensors)."""
        return {**self.weights, **{f"caches.{k}": self.session.caches[k] for k in self.cache_names}}

    def run(
        self, requests: Sequence[DraftRequest], *, capture: bool | None = None, greedy: bool | None = None
    ) -> DraftOutput:
        """Draft for `requests`; `capture` overrides the runner's flag for this pass (benchmarks);
        `greedy`: `greedy_variant(requests)` when the caller has it already."""
        n = len(requests)
        seqs = bucket_size(n)
        greedy = self.greedy_variant(requests) if greedy is None else greedy
        inputs = {f"step.{k}": v for k, v in self.session.model.draft_inputs(requests, seqs).items()}
        out = self.runner.run(
            self.key(seqs, greedy),
            lambda: self._program(seqs, greedy),
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
        logprobs = out["draft_logprobs"][:n] if "draft_logprobs" in out else None
        return DraftOutput(host[0, :n], logprobs, host[1, :n].view(torch.float32))

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
