"""`dsgraph bench`: one run = calibration, kernel side-by-sides, and the model's prefill/decode cases on
the 8-layer full-width model plus a 12-layer variant (4 more Reuse layers sharing weights) that prices
one added layer, from which the 40-layer figures are extrapolated (and labelled so)."""

from __future__ import annotations

import datetime
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.tools.bench import overlap_gap, spec_bench
from dsgraph.tools.bench.calibrate import calibrate
from dsgraph.tools.bench.extrapolate import extrapolate
from dsgraph.tools.bench.kernels_cmp import kernel_cases
from dsgraph.tools.bench.meta import commit
from dsgraph.tools.bench.model_bench import (
    Plan,
    alias_layers,
    decode_cases,
    layer_map,
    make_model,
    prefill_cases,
    synthetic_token_map,
)
from dsgraph.tools.bench.model_config import bench_config
from dsgraph.tools.bench.prefill_truncation import truncation_prefill_cases


def environment() -> dict[str, Any]:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def model_part(
    plan: Plan, cal: Any, weights: dict, deadline: float, save: Callable[[dict[str, Any]], object]
) -> dict[str, Any]:
    """The model cases; `save(partial result)` after each group of them."""
    cfg = bench_config()
    out: dict[str, Any] = {}
    prefill_model = make_model(cfg, max(plan.prefill_chunks) + 64)
    out["prefill"] = prefill_cases(prefill_model, weights, plan, cal, deadline)
    save(out)
    out["decode"] = decode_cases(cfg, weights, plan, cal, deadline)
    save(out)
    wider_cfg = bench_config(extra_reuse=2)
    wider = alias_layers(weights, layer_map(cfg, wider_cfg))
    short = replace(plan, decode_contexts=plan.decode_contexts[:1])
    out["wider_decode"] = decode_cases(wider_cfg, wider, short, cal, deadline)
    save(out)
    out["wider_prefill"] = prefill_cases(
        make_model(wider_cfg, max(plan.prefill_chunks) + 64), wider, plan, cal, deadline
    )
    out["extrapolated_40_layers"] = extrapolate(out)
    return out


def run_bench(out_dir: Path, plan: Plan, parts: tuple[str, ...]) -> Path:
    start = time.monotonic()
    result: dict[str, Any] = {
        "env": environment(),
        "plan": asdict(plan),
        "config": "tools/bench/model_config.py",
    }
    cal = calibrate()
    result["calibration"] = cal.as_dict()
    print(json.dumps(result["calibration"]), flush=True)
    if "kernels" in parts:
        result["kernels"] = kernel_cases(cal)
        print(json.dumps(result["kernels"]), flush=True)
        _write(out_dir, result)
    if "model" in parts or "spec" in parts or "prefill" in parts:
        cfg = bench_config()
        weights = random_serving_weights(cfg, synthetic_token_map(cfg), dspark="spec" in parts)
        # the model part first: it alone is held to the time budget, which the spec part would spend
        if "model" in parts:

            def save(part: dict[str, Any]) -> None:
                _write(out_dir, {**result, "model": part})

            result["model"] = model_part(plan, cal, weights, start + plan.budget_s, save)
            _write(out_dir, result)
        if "prefill" in parts:  # truncation off / mask / compact, same run
            deadline = time.monotonic() + plan.budget_s
            wider_cfg = bench_config(extra_reuse=2)
            wider = (wider_cfg, alias_layers(weights, layer_map(cfg, wider_cfg)))
            result["prefill_truncation"] = truncation_prefill_cases(
                cfg, weights, plan.prefill_chunks, deadline=deadline, wider=wider
            )
            print(json.dumps(result["prefill_truncation"]["cases"]), flush=True)
            _write(out_dir, result)
        if "spec" in parts:
            result["spec"] = {
                "doc": spec_bench.__doc__,
                "cases": spec_bench.spec_cases(cfg, weights, (1, 16, 64)),
            }
            print(json.dumps(result["spec"]["cases"]), flush=True)
    if "overlap" in parts:  # the host gap between drafting steps, overlap off / on (a tiny checkpoint)
        with tempfile.TemporaryDirectory() as tmp:
            cases = overlap_gap.host_gap_cases(overlap_gap.tiny_checkpoint(tmp), "cuda")
        result["overlap"] = {"doc": overlap_gap.__doc__, "cases": cases}
        print(json.dumps(cases), flush=True)
    return _write(out_dir, result)


def _write(out_dir: Path, result: dict[str, Any]) -> Path:
    """The result so far, at its final path (rewritten after each part: a run stopped by a time limit
    keeps what it measured)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = result["env"]["gpu"].replace(" ", "-")
    tag = "".join(c if c.isalnum() else "-" for c in result["env"]["commit"][:12])
    path = out_dir / f"bench-{gpu}-{tag}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
