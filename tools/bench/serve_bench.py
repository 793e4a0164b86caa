"""The `dsgraph bench serve` command: load runs (serve_load.py) for every (request rate, max concurrency)
given, a summary table, one JSON file with every run and the Pareto plot of the runs (plot.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from dsgraph.tools.bench.plot import Axes, pareto_svg
from dsgraph.tools.bench.serve_load import LoadSpec, dataset_prompts, random_prompts, run_load, summarize

__all__ = ["main"]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _model(base_url: str, api_key: str | None) -> str:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    data = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()
    return data["data"][0]["id"]


def _line(run: dict[str, Any]) -> str:
    def ms(block: dict[str, Any], key: str) -> str:
        value = block.get(key)
        return "n/a" if value is None else f"{value * 1e3:.1f}"

    t, o = run["ttft_s"], run["tpot_s"]
    return (
        f"rate {run['request_rate']:>6} conc {run['max_concurrency'] or '-':>4}: {run['completed']} ok "
        f"{run['failed']} failed, {run['output_throughput']:.1f} out tok/s, "
        f"{run['request_throughput']:.2f} req/s, "
        f"TTFT mean {ms(t, 'mean')} p99 {ms(t, 'p99')} ms, TPOT mean {ms(o, 'mean')} p99 {ms(o, 'p99')} ms"
    )


def _plot(runs: list[dict[str, Any]], path: Path) -> None:
    rows = [
        {**r, "setting": f"rate {r['request_rate']}", "in_flight": max(r["mean_in_flight"], 1e-9)}
        for r in runs
    ]
    axes = Axes("setting", "in_flight", str, "output tokens/s per request", "output tokens/s (server)")
    path.write_text(pareto_svg(rows, "output_throughput", "bench serve: throughput vs interactivity", axes))


def main(args: argparse.Namespace) -> int:
    percentiles = _floats(args.percentiles)
    try:
        model = args.model or _model(args.base_url, args.api_key)
        prompts = (
            dataset_prompts(Path(args.dataset), args.num_prompts, args.output_len)
            if args.dataset
            else random_prompts(
                args.num_prompts,
                args.input_len,
                args.output_len,
                args.range_ratio,
                args.seed,
                args.vocab_size,
            )
        )
    except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
        print(f"dsgraph bench serve: {exc}", file=sys.stderr)
        return 2
    runs = []
    for rate in _floats(args.request_rate):
        for conc in [int(c) for c in _floats(args.max_concurrency)] or [None]:
            spec = LoadSpec(args.base_url, args.endpoint, model, rate, conc, args.api_key, args.seed)
            results, duration = asyncio.run(run_load(spec, prompts))
            run = summarize(results, duration, percentiles)
            # mean requests in flight (Little's law): the plot's x axis divides by it
            busy = sum(r["latency_s"] for r in run["requests"] if r["ok"])
            run |= {"request_rate": "inf" if math.isinf(rate) else rate, "max_concurrency": conc}
            run["mean_in_flight"] = busy / duration
            runs.append(run)
            print(_line(run))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"base_url": args.base_url, "endpoint": args.endpoint, "model": model, "num_prompts": len(prompts)}
    path.write_text(json.dumps({"config": meta | {"percentiles": percentiles}, "runs": runs}, indent=1))
    _plot(runs, path.with_suffix(".svg"))
    print(f"wrote {path} and {path.with_suffix('.svg')}")
    return 0 if all(r["failed"] == 0 for r in runs) else 1
