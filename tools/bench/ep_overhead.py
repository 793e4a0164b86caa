"""What the expert-parallel form of the MoE costs on one GPU: the 8-layer bench model's decode step
(batches 1 and 64) with every MoE traced as route -> dispatch -> experts -> combine (the graph every EP
size runs; at EP1 dispatch and combine are the identity) and as route -> experts (no exchange ops), each
timed as the platform runs it (captured buckets on cuda); written as JSON with the ratio of the two.

    python -m dsgraph.tools.bench.ep_overhead --platform cuda --out bench/results/ep1-dispatch-overhead.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dsgraph.ops import op

CONTEXT = 8192


@contextmanager
def without_exchange_ops() -> Iterator[None]:
    """Models traced inside trace each MoE without moe_dispatch / moe_combine: the experts take the routed
    rows as they are and their sum is the routed output (what dispatch and combine amount to on one rank)."""

    def dispatch(x: Any, ids: Any, weights: Any, **_: Any) -> tuple[Any, ...]:
        return x, ids, weights, None

    def combine(y: Any, _src: Any, _ids: Any, **_: Any) -> Any:
        return y

    op.moe_dispatch, op.moe_combine = dispatch, combine  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del op.moe_dispatch, op.moe_combine  # type: ignore[attr-defined]


def _ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    if device.type == "cuda":
        from dsgraph.tools.bench.timing import time_ms

        return time_ms(fn, warmup=3, repeats=repeats)
    start = time.perf_counter()  # (warmed up by the output run)
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) * 1e3 / repeats


def measure(cfg: Any, batches: tuple[int, ...], platform: str, repeats: int, context: int) -> dict:
    from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
    from dsgraph.tools.bench.model_bench import fill_caches, make_model, session_for, synthetic_token_map
    from dsgraph.tools.bench.steps import decode_step

    weights = random_serving_weights(cfg, synthetic_token_map(cfg), device=platform, dspark=False)
    model = make_model(cfg, context + 64)
    rows: list[dict[str, Any]] = []
    sessions = {}
    for form in ("exchange", "no_exchange"):
        if form == "no_exchange":
            with without_exchange_ops():
                sessions[form] = session_for(model, weights, max(batches), context, platform)
        else:
            sessions[form] = session_for(model, weights, max(batches), context, platform)
        fill_caches(sessions[form])
    for b in batches:
        step = decode_step(model, b, context)
        outs = {f: s.run(step) for f, s in sessions.items()}  # one rank: the same logits either way
        ms = {f: _ms(lambda s=s, step=step: s.run(step), s.device, repeats) for f, s in sessions.items()}
        rows.append(
            {
                "batch": b,
                "context": context,
                "ms_with_dispatch_combine": ms["exchange"],
                "ms_without": ms["no_exchange"],
                "ratio": ms["exchange"] / ms["no_exchange"],
                "same_logits": bool(torch.equal(outs["exchange"], outs["no_exchange"])),
            }
        )
    names = ("moe_experts", "moe_dispatch", "moe_combine")
    ops = {f: {n: sum(e.op == n for e in s.graph.eqns) for n in names} for f, s in sessions.items()}
    from dsgraph.runtime.distributed.deepep import status

    return {"platform": platform, "deep_ep": status(), "exchange_ops_in_graph": ops, "decode": rows}


def main(argv: list[str] | None = None) -> int:
    from dsgraph.tools.bench.model_config import bench_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--platform", default="cuda")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--context", type=int, default=CONTEXT)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    batches = tuple(int(b) for b in args.batches.split(","))
    result = measure(bench_config(), batches, args.platform, args.repeats, args.context)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["decode"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
