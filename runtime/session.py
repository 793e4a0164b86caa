"""A Session owns one rank's weights, cache memory and lowered step programs; `run(step)` executes one
step on the cpu platform. Programs are lowered once per bucket (the concrete sizes of the step's
symbolic dims) and reused: `programs_built` counts lowerings, so a repeated bucket never re-lowers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from dsgraph.graph import Graph
from dsgraph.graph.passes import specialize
from dsgraph.graph.types import TensorType
from dsgraph.models.deepseek_v41.model import V41Model, trace_step
from dsgraph.models.deepseek_v41.step_io import ratios
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.interpret import run_program
from dsgraph.platform.registry import Program, lower

Array = torch.Tensor | np.ndarray


class CacheBudgetError(ValueError):
    """The cache budget cannot hold what the configuration asks for."""


@dataclass(frozen=True)
class CacheSizes:
    num_slots: int  # request state slots (SWA rings + compressor state)
    num_pages: dict[int, int]  # ratio -> pages of the compressed caches

    def sizes(self) -> dict[str, int]:
        return {"slots": self.num_slots, **{f"blocks{r}": n for r, n in self.num_pages.items()}}


def _bytes_per(model: V41Model, dim: str) -> int:
    """Bytes of all caches per unit of one symbolic cache dim (a slot, or a page of one ratio)."""
    total = 0
    for t in model.cache_types().values():
        if dim in t.shape:
            rest = TensorType(tuple(1 if d == dim else d for d in t.shape), t.dtype)
            total += rest.nbytes()
    return total


def size_caches(model: V41Model, num_slots: int, budget_bytes: int) -> CacheSizes:
    """Split a byte budget: `num_slots` state slots, the rest into pages; every ratio covers equal tokens."""
    rs = ratios(model.plans)
    slot_bytes = num_slots * _bytes_per(model, "slots")
    # one "unit" = enough pages of every ratio for page_size * lcm(ratios) tokens
    span = model.geo.page_size * int(np.lcm.reduce(rs)) if rs else 1
    unit_pages = {r: span // (model.geo.page_size * r) for r in rs}
    unit_bytes = sum(n * _bytes_per(model, f"blocks{r}") for r, n in unit_pages.items())
    units = (budget_bytes - slot_bytes) // unit_bytes if unit_bytes else 0
    if rs and units * span < model.geo.max_model_len:
        need = -(-model.geo.max_model_len // span) * unit_bytes + slot_bytes
        raise CacheBudgetError(
            f"cache budget {budget_bytes} B: {slot_bytes} B for {num_slots} state slots leaves room for "
            f"{max(units, 0) * span} tokens of compressed cache; one request of max_model_len "
            f"{model.geo.max_model_len} needs {need} B"
        )
    return CacheSizes(num_slots, {r: int(units * n) for r, n in unit_pages.items()})


class Session:
    def __init__(
        self, model: V41Model, weights: Mapping[str, torch.Tensor], caches: CacheSizes, *, debug: bool = False
    ) -> None:
        from dsgraph.models.deepseek_v41.weights import weight_types

        self.model = model
        self.weights = {f"weights.{k}": v for k, v in weights.items() if not k.startswith("mtp.")}
        self.graph: Graph = trace_step(model, weight_types(dict(weights)), debug=debug)
        self.cache_sizes = caches
        self.caches = {
            name: torch.zeros([caches.sizes().get(d, d) for d in t.shape], dtype=to_torch(t.dtype))
            for name, t in model.cache_types().items()
        }
        self.programs: dict[tuple[tuple[str, int], ...], Program] = {}
        self.programs_built = 0
        self.last_debug: dict[str, torch.Tensor] = {}

    def _program(self, step: Mapping[str, torch.Tensor]) -> Program:
        sizes = dict(self.cache_sizes.sizes())
        sizes.update(tokens=int(step["token_ids"].shape[0]), seqs=int(step["seq_slot"].shape[0]))
        sizes["outs"] = int(step["sample_rows"].shape[0])
        key = tuple(sorted(sizes.items()))
        if key not in self.programs:
            self.programs[key] = lower(specialize(self.graph, sizes), "cpu")
            self.programs_built += 1
        return self.programs[key]

    def run(self, step: Mapping[str, Array]) -> torch.Tensor:
        """Execute one step (inputs of `V41Model.step_types()` by name); returns logits [outs, vocab]."""
        tensors = {
            k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v)) for k, v in step.items()
        }
        args = {**self.weights, **{f"caches.{k}": v for k, v in self.caches.items()}}
        args.update({f"step.{k}": v for k, v in tensors.items()})
        out = run_program(self._program(tensors), args)
        for name in self.caches:
            self.caches[name] = out[f"caches.{name}"]
        self.last_debug = {k.removeprefix("debug."): v for k, v in out.items() if k.startswith("debug.")}
        return out["logits"]
