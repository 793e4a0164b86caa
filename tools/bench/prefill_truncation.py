"""Prefill with truncation against off, in the same run: one fresh prompt of `chunk` tokens prefilled in
one step, for truncation off, mask and compact (the decoder layers on the last KEEP = window + maximum
backtrack tokens), at each chunk size. Tokens/s of each, and the speed-up of mask and compact over off.
Compact at 16k is the figure the targets name (>= 1.6x on the H200 at 40 layers); the bench model has
4 decoder layers of 8, so its ratio is a lower bound of the 40-layer one only where the decoder share is
equal (20 of 40 in V4.1: the same half). With `wider` (the 12-layer bench model: 2 more Reuse layers on
each side of the boundary) off and compact are timed on it too, and `extrapolated_40_layers` prices the
32 further layers of the released model at the measured cost of one added layer (tools/bench/extrapolate.py's
method; labelled extrapolated)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.runtime.prefill_truncation import min_keep_tokens, truncated_inputs
from dsgraph.tools.bench.extrapolate import ADDED_LAYERS, WIDER_EXTRA
from dsgraph.tools.bench.model_bench import _case, session_for, synthetic_token_map
from dsgraph.tools.bench.steps import prefill_step

__all__ = ["truncation_prefill_cases", "wall_ms"]

Timer = Callable[[Callable[[], object]], float]


def wall_ms(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 3) -> float:
    """Median wall-clock milliseconds of `fn` (the cpu platform's timer; cuda uses CUDA events)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _device_timer(chunk: int, capture_max: int) -> Timer:
    from dsgraph.tools.bench.timing import time_ms

    big = chunk > capture_max  # eager, seconds per step: fewer repeats
    return lambda fn: time_ms(fn, warmup=1 if big else 2, repeats=2 if big else 5)


def _mode_case(
    cfg: ModelConfig,
    weights: Mapping[str, Tensor],
    chunk: int,
    mode: str,
    keep: int,
    platform: str,
    timer: Timer | None,
) -> dict[str, Any]:
    model = build_model(
        cfg, synthetic_token_map(cfg), SERVING, default_geometry(cfg.text, chunk + 64), truncation=mode
    )
    session = session_for(model, weights, 1, chunk, platform)
    step = prefill_step(model, chunk)
    if mode != "off":
        cut = truncated_inputs(step, np.array([chunk - keep], np.int32), mode, cfg.text.sliding_window)
        step = step if cut is None else cut
    if timer is None:
        timer = wall_ms if platform == "cpu" else _device_timer(chunk, session.capture_max_tokens)
    ms = timer(lambda: session.run(step))
    logits = session.run(step).float().cpu()
    decoder_rows = int(step["kept_rows"].shape[0]) if "kept_rows" in step else chunk
    return {
        "ms": ms,
        "tokens_per_s": chunk / (ms * 1e-3),
        "decoder_rows": decoder_rows,
        "captured": session.captures > 0,
        "finite_logits": bool(torch.isfinite(logits).all()),
        "_logits": logits,
    }


def truncation_prefill_cases(
    cfg: ModelConfig,
    weights: Mapping[str, Tensor],
    chunks: Sequence[int],
    *,
    platform: str = "cuda",
    deadline: float = float("inf"),
    timer: Timer | None = None,
    wider: tuple[ModelConfig, Mapping[str, Tensor]] | None = None,
) -> dict[str, Any]:
    """For each chunk: off, mask and compact timed back to back; mask and compact logits compared.
    `timer` (None: CUDA events on cuda, wall clock on cpu) times one call of a step."""
    keep = min_keep_tokens(cfg.text)
    rows = []
    for chunk in chunks:
        row: dict[str, Any] = {"chunk": chunk, "keep": keep}
        for mode in ("off", "mask", "compact"):
            case = partial(_mode_case, cfg, weights, chunk, mode, keep, platform, timer)
            row[mode] = _guarded(case, deadline)
        if wider is not None:
            for mode in ("off", "compact"):
                case = partial(_mode_case, *wider, chunk, mode, keep, platform, timer)
                row[f"wider_{mode}"] = _guarded(case, deadline)
                row[f"wider_{mode}"].pop("_logits", None)
        _ratios(row)
        rows.append(row)
    return {"doc": __doc__, "keep": keep, "cases": rows}


def _guarded(case: Callable[[], dict[str, Any]], deadline: float) -> dict[str, Any]:
    """The model bench's guard (time budget, a failing case recorded), then the case's memory freed."""
    out = _case(case, deadline)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def _extrapolated(row: dict[str, Any]) -> dict[str, Any] | None:
    """40 layers = the 8 measured + 32 at the cost of one added layer, (T12 - T8) / 4, per mode."""
    ms = {k: row[k].get("ms") for k in ("off", "compact", "wider_off", "wider_compact") if k in row}
    if not all(ms.get(k) for k in ("off", "compact", "wider_off", "wider_compact")):
        return None
    est = {
        m: ms[m] + ADDED_LAYERS * max((ms[f"wider_{m}"] - ms[m]) / WIDER_EXTRA, 0.0)
        for m in ("off", "compact")
    }
    return {
        "label": "extrapolated from 8 and 12 measured layers",
        "ms_off": est["off"],
        "ms_compact": est["compact"],
        "tokens_per_s_compact": row["chunk"] / (est["compact"] * 1e-3),
        "speedup_compact": est["off"] / est["compact"],
    }


def _ratios(row: dict[str, Any]) -> None:
    logits = {m: row[m].pop("_logits", None) for m in ("off", "mask", "compact") if isinstance(row[m], dict)}
    if logits.get("mask") is not None and logits.get("compact") is not None:
        row["mask_compact_max_abs_diff"] = float((logits["mask"] - logits["compact"]).abs().max())
    if logits.get("off") is not None and logits.get("compact") is not None:
        row["compact_off_max_abs_diff"] = float((logits["off"] - logits["compact"]).abs().max())
    off = row["off"].get("ms") if isinstance(row["off"], dict) else None
    for mode in ("mask", "compact"):
        ms = row[mode].get("ms") if isinstance(row[mode], dict) else None
        if off and ms:
            row[f"speedup_{mode}"] = off / ms
    extra = _extrapolated(row)
    if extra is not None:
        row["extrapolated_40_layers"] = extra
