"""What programmatic dependent launch (platform/cuda/pdl.py) buys a captured decode step: the 8-layer bench
model's decode step at each batch, captured plainly, with PDL, and with PDL and the GEMMs' weight prefetch
(the default on sm_90), same weights, same run; written as JSON with the ratios, each step's fraction of
the copy bandwidth measured in the same run, and whether the logits have the same bits (they must: PDL
only changes when a kernel starts).

    python -m dsgraph.tools.bench.pdl_ab --out bench/results/pdl-ab.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

CONTEXT = 8192


def _settings() -> dict[str, tuple[bool, int, bool]]:
    from dsgraph.platform.cuda.pdl import PREFETCH_ROW_BYTES

    # name -> pdl.setting's (on, prefetch bytes per row, early trigger); "pdl_late": each kernel only
    # waits, so the next launches when its programs have exited (f248b22 also had a whole-row prefetch)
    return {
        "plain": (False, 0, True),
        "pdl": (True, 0, True),
        "pdl_late": (True, 0, False),
        "pdl_prefetch": (True, PREFETCH_ROW_BYTES, True),
    }


def _one_setting(model: Any, weights: Any, batches: tuple[int, ...], context: int, repeats: int, how: tuple):
    """{batch: (ms, logits, the captured kernels' profile at batch 1)} of a session whose buckets are
    captured with `how`. With PDL a kernel's time includes its wait for the one before, so the profile's
    kernel_ms above the step time is their overlap."""
    from dsgraph.platform.cuda import pdl
    from dsgraph.tools.bench.model_bench import fill_caches, session_for
    from dsgraph.tools.bench.profile import captured_kernels
    from dsgraph.tools.bench.steps import decode_step
    from dsgraph.tools.bench.timing import time_ms

    session = session_for(model, weights, max(batches), context)
    fill_caches(session)
    out = {}
    for b in batches:
        step = decode_step(model, b, context)
        with pdl.setting(*how):  # the bucket is captured at its first run
            logits = session.run(step).cpu()
        ms = time_ms(lambda step=step, s=session: s.run(step), warmup=3, repeats=repeats)
        kernels = captured_kernels(lambda step=step, s=session: s.run(step), top=25) if b == 1 else None
        out[b] = (ms, logits, kernels)
    del session
    torch.cuda.empty_cache()
    return out


def measure(
    cfg: Any, batches: tuple[int, ...], repeats: int, context: int, names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`names`: the settings to run ("plain" always first; all when empty)."""
    from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
    from dsgraph.tools.bench.calibrate import copy_bandwidth_gbps
    from dsgraph.tools.bench.meta import commit, device_name
    from dsgraph.tools.bench.model_bench import make_model, synthetic_token_map
    from dsgraph.tools.bench.traffic import decode_bytes

    copy_gbps = copy_bandwidth_gbps()
    weights = random_serving_weights(cfg, synthetic_token_map(cfg), device="cuda", dspark=False)
    model = make_model(cfg, context + 64)
    chosen = {k: v for k, v in _settings().items() if k == "plain" or not names or k in names}
    runs = {name: _one_setting(model, weights, batches, context, repeats, h) for name, h in chosen.items()}
    rows = []
    for b in batches:
        nbytes = decode_bytes(model, weights, b, context)
        plain_ms, plain_logits, _ = runs["plain"][b]
        row: dict[str, Any] = {"batch": b, "context": context}
        for name, per_batch in runs.items():
            ms, logits, kernels = per_batch[b]
            row[name] = {
                "ms": ms,
                "speedup_over_plain": plain_ms / ms,
                "fraction_of_copy": nbytes / (ms * 1e-3) / 1e9 / copy_gbps,
                "same_logits_as_plain": bool(torch.equal(logits, plain_logits)),
                **({"captured_kernels": kernels} if kernels else {}),
            }
        rows.append(row)
        print(json.dumps(row)[:2000], flush=True)
    return {
        "gpu": device_name("cuda"),
        "commit": commit(),
        "copy_gbps": copy_gbps,
        "model": "bench-8-layer",
        "settings": {
            k: {"pdl": v[0], "prefetch_row_bytes": v[1], "early_trigger": v[2]} for k, v in chosen.items()
        },
        "decode": rows,
    }


def main(argv: list[str] | None = None) -> int:
    from dsgraph.tools.bench.model_config import bench_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,64")
    p.add_argument("--context", type=int, default=CONTEXT)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--settings", default="", help=f"comma-separated of {list(_settings())} (default: all)")
    args = p.parse_args(argv)
    names = tuple(n for n in args.settings.split(",") if n)
    if unknown := sorted(set(names) - set(_settings())):
        p.error(f"--settings: {unknown}, expected names of {list(_settings())}")
    batches = tuple(int(b) for b in args.batches.split(","))
    result = measure(bench_config(), batches, args.repeats, args.context, names)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
