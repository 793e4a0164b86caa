"""The memory planner: bytes per GPU by kind for a model, a GPU count and an EP size, and whether they fit.

- dense weights: every tensor but the routed experts and the Engram tables, on every GPU (replicated);
- experts: of each MoE (routed + redundant by DeepInfer's rounding, backbone and drafter apart)
  (routed + redundant) / ep experts per GPU;
- Engram tables: in host memory, once per node (not on the GPUs);
- caches: max_num_seqs requests of max_model_len on each rank (data-parallel attention);
- captured-graph pools: the activation arena of the largest captured step bucket (one pool shared by
  every bucket's graph), from the memory plan of the traced step graph;
- workspace: the all-to-all send and receive buffers of a step at EP > 1, plus `reserve` bytes for the
  CUDA context and allocator slack (an assumption, stated in the report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dsgraph.graph.passes import optimize, specialize
from dsgraph.graph.passes.memory import plan_memory
from dsgraph.runtime.distributed.config import DEFAULT_EXTRA_EXPERTS, check_ep, num_redundant
from dsgraph.runtime.engine_config import CacheConfig, EngineConfig, SchedulingConfig
from dsgraph.runtime.step_padding import bucket_size

GIB = 1 << 30
H200_GIB = 140.0  # 143,771 MiB as nvidia-smi reports an H200
RESERVE_GIB = 2.0
BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I8": 1, "F8_E8M0": 1, "U8": 1}
GPU_KINDS = ("dense weights", "experts", "caches", "captured-graph pools", "workspace")


@dataclass(frozen=True)
class PlanRequest:
    gpus: int
    ep: int
    gpu_mem_gib: float = H200_GIB
    # the engine's own defaults (EngineConfig), so a plan without these flags is the engine's
    max_model_len: int = EngineConfig.max_model_len
    max_num_seqs: int = SchedulingConfig.max_num_seqs
    max_num_batched_tokens: int = SchedulingConfig.max_num_batched_tokens
    page_size: int = CacheConfig.page_size
    extra_experts: int = DEFAULT_EXTRA_EXPERTS

    def __post_init__(self) -> None:
        for name in ("gpus", "ep", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "page_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} is {getattr(self, name)}, expected >= 1")
        if self.ep > self.gpus:
            raise ValueError(f"--ep {self.ep} is more ranks than --gpus {self.gpus}; allowed: 1..{self.gpus}")
        if self.gpus % self.ep:
            ok = [d for d in range(1, self.gpus + 1) if self.gpus % d == 0]
            raise ValueError(f"--ep {self.ep} does not divide --gpus {self.gpus}; allowed: {ok}")
        if not self.gpu_mem_gib > 0:
            raise ValueError(f"--gpu-mem is {self.gpu_mem_gib}, expected > 0 GiB")


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    per_gpu: dict[str, int]  # kind -> bytes on each GPU
    host: dict[str, int]  # kind -> bytes in host memory, per node
    experts: dict[str, tuple[int, int]]  # "backbone"/"drafter" -> (routed, redundant)

    @property
    def total(self) -> int:
        return sum(self.per_gpu.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.request.gpu_mem_gib * GIB

    def as_text(self) -> str:
        r = self.request
        lines = [f"per GPU ({r.gpus} GPUs, EP {r.ep}, {r.gpu_mem_gib:g} GiB each):"]
        lines += [f"  {k:<22}{v:>18,} B  {v / GIB:9.2f} GiB" for k, v in self.per_gpu.items()]
        lines.append(f"  {'total':<22}{self.total:>18,} B  {self.total / GIB:9.2f} GiB")
        lines += [f"host, per node: {k} {v:,} B ({v / GIB:.2f} GiB)" for k, v in self.host.items()]
        lines += [f"{k} experts: {a} routed + {b} redundant" for k, (a, b) in self.experts.items()]
        lines.append(f"workspace includes {RESERVE_GIB:g} GiB assumed for the CUDA context and allocator")
        verdict = "fits" if self.fits else "does not fit"
        lines.append(f"{verdict}: {self.total / GIB:.2f} GiB of {r.gpu_mem_gib:g} GiB per GPU")
        return "\n".join(lines) + "\n"


def _weight_bytes(specs: dict[str, Any]) -> tuple[int, int, dict[str, int]]:
    """(dense bytes, engram bytes, bytes of each MoE's routed experts by prefix)."""
    dense = engram = 0
    experts: dict[str, int] = {}
    for name, s in specs.items():
        b = math.prod(s.shape) * BYTES[s.dtype]
        if ".ffn.experts." in name:
            moe = name[: name.index("ffn.experts.")]
            experts[moe] = experts.get(moe, 0) + b
        elif ".engram.embed." in name:
            engram += b
        else:
            dense += b
    return dense, engram, experts


def _activations(model: Any, weights: dict[str, Any], sizes: dict[str, int], tokens: int) -> int:
    from dsgraph.models.interface import weight_types

    graph = optimize(model.trace_step(weight_types(weights)))
    s = {**sizes, "tokens": tokens, "seqs": min(tokens, sizes["slots"]), "outs": min(tokens, sizes["slots"])}
    return plan_memory(specialize(graph, s)).arena_bytes


@dataclass(frozen=True)
class ModelBytes:
    """What does not depend on the GPU count: weights by kind, one rank's caches and step arena."""

    dense: int
    engram: int
    moes: dict[str, int]  # MoE prefix -> bytes of its routed experts
    caches: int
    pools: int


def model_bytes(cfg: Any, req: PlanRequest) -> ModelBytes:
    from dsgraph.models.interface import default_geometry, numerics_for, ratios, torch_dtype
    from dsgraph.models.registry import family_of
    from dsgraph.runtime.session import CacheSizes

    t, family = cfg.text, family_of(cfg)
    specs = family.expected_tensors(cfg)
    dense, engram, moes = _weight_bytes(specs)
    num, token_map = numerics_for("serving"), list(range(t.vocab_size))
    geo = default_geometry(t, min(req.max_model_len, t.max_position_embeddings), req.page_size)
    model = family.build(cfg, None, num, geo, False, token_map=token_map)
    pages = {r: geo.pages_per_seq(r) * req.max_num_seqs for r in ratios(model.plans)}
    sizes = CacheSizes(req.max_num_seqs, pages).sizes()
    caches = sum(
        ty.with_shape(tuple(sizes.get(d, d) for d in ty.shape)).nbytes()
        for ty in model.cache_types().values()
    )
    meta = {n: torch.empty(s.shape, dtype=torch_dtype(s.dtype), device="meta") for n, s in specs.items()}
    weights = family.prepare_weights(cfg, meta, num, token_map)
    pools = _activations(model, weights, sizes, bucket_size(req.max_num_batched_tokens))
    return ModelBytes(dense, engram, moes, caches, pools)


def plan(cfg: Any, req: PlanRequest, base: ModelBytes | None = None) -> Plan:
    t, m = cfg.text, base if base is not None else model_bytes(cfg, req)
    experts, kinds = 0, {}
    for moe, b in m.moes.items():
        what = "drafter" if moe.startswith("mtp.") else "backbone"
        routed = t.dspark_n_routed_experts if what == "drafter" else t.n_routed_experts
        extra = num_redundant(routed, req.ep, req.extra_experts, f"{what} experts")
        check_ep(req.ep, routed, extra, f"{what} experts")
        experts += b // routed * ((routed + extra) // req.ep)
        kinds[what] = (routed, extra)
    pairs = req.max_num_batched_tokens * t.num_experts_per_tok
    # send + receive: a bf16 row, slot and weight out, the f32 output back
    exchange = 2 * pairs * (t.hidden_size * 2 + 8 + t.hidden_size * 4) if req.ep > 1 else 0
    values = (m.dense, experts, m.caches, m.pools, exchange + int(RESERVE_GIB * GIB))
    return Plan(req, dict(zip(GPU_KINDS, values, strict=True)), {"engram tables": m.engram}, kinds)


def smallest_fit(cfg: Any, req: PlanRequest, limit: int = 64, base: ModelBytes | None = None) -> int | None:
    """The fewest GPUs (EP = GPUs) whose plan fits, up to `limit`."""
    import dataclasses

    base = base if base is not None else model_bytes(cfg, req)
    for n in range(1, limit + 1):
        if plan(cfg, dataclasses.replace(req, gpus=n, ep=n), base).fits:
            return n
    return None
