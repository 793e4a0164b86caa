"""Step throughput of the benchmark model on the cuda platform: prefill chunks (non-cached tokens/s
against the measured FP8 GEMM rate) and decode batches x contexts (tokens/s per GPU and per request,
bytes that must be read / step time against the measured copy bandwidth). Each case is measured on its
own; a case that fails or does not fit records its error and the rest go on."""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.layers_plan import LayerPlan, layer_plans
from dsgraph.models.deepseek_v41.model import V41Model, build_model
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.tools.bench.calibrate import Calibration
from dsgraph.tools.bench.profile import captured_kernels, op_profile
from dsgraph.tools.bench.steps import decode_step, pages_for, prefill_step
from dsgraph.tools.bench.timing import time_ms
from dsgraph.tools.bench.traffic import active_weight_elements, decode_bytes

_LAYER = re.compile(r"layers\.(\d+)\.(.*)")


@dataclass(frozen=True)
class Plan:
    prefill_chunks: tuple[int, ...] = (4096, 16384, 65536)
    decode_batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    decode_contexts: tuple[int, ...] = (8192, 32768, 131072)
    budget_s: float = 420.0  # wall-clock for all model cases; later cases are skipped past it


def synthetic_token_map(cfg: ModelConfig) -> list[int]:
    """Engram's normalised-token map without a tokenizer: work per token does not depend on it."""
    return [v % cfg.text.engram_compressed_vocab_size for v in range(cfg.text.vocab_size)]


def make_model(cfg: ModelConfig, max_len: int, *, dspark: bool = False) -> V41Model:
    geo = default_geometry(cfg.text, max_len)
    return build_model(cfg, synthetic_token_map(cfg), SERVING, geo, dspark=dspark)


def layer_map(base: ModelConfig, wider: ModelConfig) -> dict[int, int]:
    """wider layer -> the base layer of the same kind (mode, ratio, Engram) whose weights it shares: the
    k-th layer of a kind takes the base's k-th of that kind, or its last when the base has fewer."""

    def kind(p: LayerPlan) -> tuple[object, ...]:
        return (p.mode, p.ratio, p.engram_table >= 0)

    by_kind: dict[tuple[object, ...], list[int]] = {}
    for p in layer_plans(base.text):
        by_kind.setdefault(kind(p), []).append(p.index)
    seen: dict[tuple[object, ...], int] = {}
    out = {}
    for p in layer_plans(wider.text):
        k = kind(p)
        if k not in by_kind:
            raise ValueError(
                f"layer {p.index} of the wider model ({p.as_text()}) has no kind in the base model"
            )
        out[p.index] = by_kind[k][min(seen.get(k, 0), len(by_kind[k]) - 1)]
        seen[k] = seen.get(k, 0) + 1
    return out


def alias_layers(weights: Mapping[str, Tensor], layer_map: Mapping[int, int]) -> dict[str, Tensor]:
    """Weights of a deeper model whose layer i shares the tensors of base layer layer_map[i]."""
    base = {k: v for k, v in weights.items() if not _LAYER.match(k)}
    for new, old in layer_map.items():
        for k, v in weights.items():
            m = _LAYER.match(k)
            if m and int(m[1]) == old:
                base[f"layers.{new}.{m[2]}"] = v
    return base


def fill_caches(session: Session, seed: int = 0) -> None:
    """Random bytes that decode as finite values in every cache format (see flashmla_ref)."""
    tensors = list(session.caches.values())
    gen = torch.Generator(device=tensors[0].device).manual_seed(seed)
    for t in tensors:
        if t.dtype == torch.uint8:
            t.random_(0x30, 0x40, generator=gen)
        else:
            t.normal_(generator=gen)


def session_for(
    model: V41Model, weights: Mapping[str, Tensor], seqs: int, context: int, platform: str = "cuda"
) -> Session:
    pages = {r: seqs * pages_for(model, r, context) for r in ratios(model.plans)}
    return Session(model, weights, CacheSizes(seqs, pages), platform=platform)


def _case(fn: Callable[[], dict[str, Any]], deadline: float) -> dict[str, Any]:
    if time.monotonic() > deadline:
        return {"skipped": "over the bench's time budget"}
    try:
        return fn()
    except Exception as exc:  # one case failing (out of memory, say) must not end the bench
        torch.cuda.empty_cache()
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def prefill_case(model: V41Model, weights: Mapping[str, Tensor], chunk: int, cal: Calibration) -> dict:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    session = session_for(model, weights, 1, chunk)
    step = prefill_step(model, chunk)
    big = chunk > session.capture_max_tokens  # eager, seconds per step: fewer repeats
    ms = time_ms(lambda: session.run(step), warmup=1 if big else 2, repeats=2 if big else 5)
    peak = torch.cuda.max_memory_allocated() if session.device.type == "cuda" else 0
    profile = op_profile(session, step) if chunk == 4096 else None
    kernels = _captured_kernels(session, step) if chunk == 4096 else None
    flops = 2 * chunk * active_weight_elements(model)
    return {
        "chunk": chunk,
        "ms": ms,
        "tokens_per_s": chunk / (ms * 1e-3),
        "gemm_tflops": flops / (ms * 1e-3) / 1e12,
        "fraction_of_fp8_gemm": flops / (ms * 1e-3) / 1e12 / cal.fp8_gemm_tflops,
        "captures": session.captures,
        "peak_allocated_gb": peak / 1e9,
        **({"profile": profile} if profile else {}),
        **({"captured_kernels": kernels} if kernels else {}),
    }


def decode_case(
    session: Session, weights: Mapping[str, Tensor], batch: int, ctx: int, cal: Calibration
) -> dict:
    model = session.model
    step = decode_step(model, batch, ctx)
    ms = time_ms(lambda: session.run(step), warmup=3, repeats=10)
    nbytes = decode_bytes(model, weights, batch, ctx)
    profiled = batch in (1, 64) and ctx == 8192
    profile = op_profile(session, step) if profiled else None
    kernels = _captured_kernels(session, step) if profiled else None
    return {
        **({"profile": profile} if profile else {}),
        **({"captured_kernels": kernels} if kernels else {}),
        "batch": batch,
        "context": ctx,
        "ms": ms,
        "tokens_per_s_per_gpu": batch / (ms * 1e-3),
        "tokens_per_s_per_request": 1 / (ms * 1e-3),
        "bytes_read": nbytes,
        "fraction_of_copy_bandwidth": nbytes / (ms * 1e-3) / 1e9 / cal.copy_gbps,
    }


def _captured_kernels(session: Session, step: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return captured_kernels(lambda: session.run(step))
    except Exception as exc:  # noqa: BLE001  (a profiler failure must not cost the case)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def prefill_cases(
    model: V41Model, weights: Mapping[str, Tensor], plan: Plan, cal: Calibration, deadline: float
) -> list:
    rows = []
    for c in plan.prefill_chunks:
        rows.append({"chunk": c, **_case(partial(prefill_case, model, weights, c, cal), deadline)})
        gc.collect()  # the case's session and its captured graphs' pool, before the next chunk's
        torch.cuda.empty_cache()
    return rows


def _decode_context(
    cfg: ModelConfig, weights: Mapping[str, Tensor], plan: Plan, cal: Calibration, ctx: int, deadline: float
) -> list[dict[str, Any]]:
    model = make_model(cfg, ctx + 64)
    try:
        session = session_for(model, weights, max(plan.decode_batches), ctx)
    except Exception as exc:  # caches for this context do not fit: record it for every batch
        torch.cuda.empty_cache()
        return [
            {"batch": b, "context": ctx, "error": f"{type(exc).__name__}: {exc}"[:300]}
            for b in plan.decode_batches
        ]
    fill_caches(session)
    rows = [
        {"batch": b, "context": ctx, **_case(partial(decode_case, session, weights, b, ctx, cal), deadline)}
        for b in plan.decode_batches
    ]
    del session
    torch.cuda.empty_cache()
    return rows


def decode_cases(
    cfg: ModelConfig, weights: Mapping[str, Tensor], plan: Plan, cal: Calibration, deadline: float
) -> list[dict[str, Any]]:
    """One session per context (caches for the largest batch); every batch is a captured bucket of it."""
    return [
        row for ctx in plan.decode_contexts for row in _decode_context(cfg, weights, plan, cal, ctx, deadline)
    ]
