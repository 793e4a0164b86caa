"""A small driver of the target step with the DSpark context on, and of the draft graph, on the cpu
platform: the bookkeeping of runtime/step_runner.py (slots, pages, step inputs) plus the context rings.

The runtime's Session keeps `mtp.*` weights out of the step graph; until the engine wires the drafter,
the DSpark tests run the two graphs through this driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dsgraph.graph import Graph
from dsgraph.graph.passes import specialize
from dsgraph.models.deepseek_v41.dspark import ConfidenceInput, trace_draft
from dsgraph.models.deepseek_v41.dspark_context import is_context_weight, is_draft_weight
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest, draft_inputs
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import V41Model, build_model, trace_step
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.models.deepseek_v41.weights import prepare_weights, weight_types
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.interpret import run_program
from dsgraph.platform.registry import Program, lower
from dsgraph.runtime.step_builder import CachePool, SeqState, StepBuilder
from tests.oracle import model_fixtures as fx


class _Programs:
    """One lowered program per bucket of a graph."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.built: dict[tuple[tuple[str, int], ...], Program] = {}

    def run(self, sizes: dict[str, int], args: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        key = tuple(sorted(sizes.items()))
        if key not in self.built:
            self.built[key] = lower(specialize(self.graph, sizes), "cpu")
        return run_program(self.built[key], args)


class DSparkRunner:
    """Target steps that write the DSpark context, and draft passes that read it."""

    def __init__(
        self,
        model_dir: Path,
        num: Numerics,
        text_overrides: dict[str, Any] | None = None,
        *,
        num_slots: int = 4,
        num_pages: int = 32,
        debug: bool = False,
        dspark: bool = True,
    ) -> None:
        cfg = fx.config(model_dir, text_overrides)
        token_map, _ = build_token_map(load_tokenizer(model_dir))
        geo = default_geometry(cfg.text, fx.MAX_MODEL_LEN, fx.PAGE_SIZE)
        self.model: V41Model = build_model(cfg, token_map, num, geo, dspark=dspark)
        weights = prepare_weights(cfg, fx._stored(model_dir), num, token_map)
        target = {
            k: v for k, v in weights.items() if not k.startswith("mtp.") or (dspark and is_context_weight(k))
        }
        draft = {k: v for k, v in weights.items() if is_draft_weight(k)}
        self.step_graph = trace_step(self.model, weight_types(target, backbone_only=False), debug=debug)
        self._draft_types = weight_types(draft, backbone_only=False)
        self.debug = debug
        self.target_weights = {f"weights.{k}": v for k, v in target.items()}
        self.draft_weights = {f"weights.{k}": v for k, v in draft.items()}
        self.sizes = {"slots": num_slots, **{f"blocks{r}": num_pages for r in ratios(self.model.plans)}}
        self.caches = {
            name: torch.zeros([self.sizes.get(d, d) for d in t.shape], dtype=to_torch(t.dtype))
            for name, t in self.model.cache_types().items()
        }
        self.pool = CachePool(self.model, num_slots, {r: num_pages for r in ratios(self.model.plans)})
        self.requests: dict[int, SeqState] = {}
        self._step = _Programs(self.step_graph)
        self._drafts: dict[str, _Programs] = {}
        self.last_debug: dict[str, torch.Tensor] = {}

    @property
    def text(self):  # type: ignore[no-untyped-def]
        return self.model.cfg.text

    def add(self, rid: int) -> None:
        self.requests[rid] = self.pool.open()

    def release(self, rid: int) -> None:
        """Close the request: its slot and pages go back to the pool for the next test."""
        self.pool.close(self.requests.pop(rid))

    def step_inputs(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> dict[str, torch.Tensor]:
        """The inputs of a step over (request id, new token ids) chunks, every row's logits wanted (the
        runtime's one step-input builder)."""
        builder = StepBuilder(self.model, self.pool)
        for rid, new in chunks:
            builder.add(self.requests[rid], new, logits="all")
        return builder.build().inputs

    def step(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> list[torch.Tensor]:
        """One target step over (request id, new token ids); returns each chunk's logits [len, V]."""
        inputs = self.step_inputs(chunks)
        sizes = {**self.sizes, "tokens": len(inputs["token_ids"]), "seqs": len(chunks)}
        sizes["outs"] = sizes["tokens"]
        args = {**self.target_weights, **{f"caches.{k}": v for k, v in self.caches.items()}}
        args.update({f"step.{k}": v for k, v in inputs.items()})
        out = self._step.run(sizes, args)
        self.caches = {k: out[f"caches.{k}"] for k in self.caches}
        self.last_debug = {k.removeprefix("debug."): v for k, v in out.items() if k.startswith("debug.")}
        for rid, new in chunks:
            self.requests[rid].tokens += list(new)
        return list(torch.split(out["logits"], [len(new) for _, new in chunks]))

    def draft_graph(self, confidence_input: ConfidenceInput = "pre_norm") -> Graph:
        if confidence_input not in self._drafts:
            graph = trace_draft(
                self.model, self._draft_types, debug=self.debug, confidence_input=confidence_input
            )
            self._drafts[confidence_input] = _Programs(graph)
        return self._drafts[confidence_input].graph

    def draft(
        self,
        requests: Sequence[DraftRequest],
        num_seqs: int | None = None,
        confidence_input: ConfidenceInput = "pre_norm",
    ) -> dict[str, torch.Tensor]:
        """One draft pass; outputs `draft_tokens`, `draft_logprobs`, `confidence` (+ `debug.*`)."""
        self.draft_graph(confidence_input)
        inputs = draft_inputs(self.text, requests, num_seqs)
        seqs = int(inputs["seq_slot"].shape[0])
        sizes = {"slots": self.sizes["slots"], "seqs": seqs, "tokens": seqs * self.text.dspark_block_size}
        rings = {f"caches.{k}": v for k, v in self.caches.items() if k.startswith("dspark.")}
        args = {**self.draft_weights, **rings, **{f"step.{k}": v for k, v in inputs.items()}}
        return self._drafts[confidence_input].run(sizes, args)

    def anchor(self, rid: int, token: int, **sampling: Any) -> DraftRequest:
        """The draft request of request `rid` with anchor `token` at its next position."""
        req = self.requests[rid]
        return DraftRequest(anchor=token, position=len(req.tokens), slot=req.slot, **sampling)
