"""What programmatic dependent launch (platform/cuda/pdl.py) buys a captured decode step: the 8-layer bench
model's decode step at each batch, captured with PDL (the default on sm_90) and without it, same weights,
same caches, same run; written as JSON with the ratio, each step's fraction of the copy bandwidth measured
in the same run, and whether the logits have the same bits (they must: PDL only changes when a kernel
starts).

    python -m dsgraph.tools.bench.pdl_ab --out bench/results/pdl-ab.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

CONTEXT = 8192
SETTINGS = ("on", "off")


def measure(cfg: Any, batches: tuple[int, ...], repeats: int, context: int) -> dict[str, Any]:
    from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
    from dsgraph.platform.cuda import pdl
    from dsgraph.tools.bench.calibrate import copy_bandwidth_gbps
    from dsgraph.tools.bench.meta import commit, device_name
    from dsgraph.tools.bench.model_bench import fill_caches, make_model, session_for, synthetic_token_map
    from dsgraph.tools.bench.steps import decode_step
    from dsgraph.tools.bench.timing import time_ms
    from dsgraph.tools.bench.traffic import decode_bytes

    copy_gbps = copy_bandwidth_gbps()
    weights = random_serving_weights(cfg, synthetic_token_map(cfg), device="cuda", dspark=False)
    model = make_model(cfg, context + 64)
    sessions = {s: session_for(model, weights, max(batches), context) for s in SETTINGS}
    for session in sessions.values():
        fill_caches(session)
    rows = []
    for b in batches:
        step = decode_step(model, b, context)
        outs, ms = {}, {}
        for s, session in sessions.items():
            with pdl.setting(s == "on"):  # the bucket is captured at its first run
                outs[s] = session.run(step).clone()
        for s, session in sessions.items():
            ms[s] = time_ms(lambda session=session, step=step: session.run(step), warmup=3, repeats=repeats)
        nbytes = decode_bytes(model, weights, b, context)
        rows.append(
            {
                "batch": b,
                "context": context,
                "ms_pdl": ms["on"],
                "ms_plain": ms["off"],
                "speedup": ms["off"] / ms["on"],
                "fraction_of_copy_pdl": nbytes / (ms["on"] * 1e-3) / 1e9 / copy_gbps,
                "fraction_of_copy_plain": nbytes / (ms["off"] * 1e-3) / 1e9 / copy_gbps,
                "same_logits": bool(torch.equal(outs["on"], outs["off"])),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return {
        "gpu": device_name("cuda"),
        "commit": commit(),
        "copy_gbps": copy_gbps,
        "model": "bench-8-layer",
        "decode": rows,
    }


def main(argv: list[str] | None = None) -> int:
    from dsgraph.tools.bench.model_config import bench_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,64")
    p.add_argument("--context", type=int, default=CONTEXT)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    batches = tuple(int(b) for b in args.batches.split(","))
    result = measure(bench_config(), batches, args.repeats, args.context)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
