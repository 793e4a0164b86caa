"""`dsgraph bench router-sim`: the router's policies simulated at scale (router_sim.py for decode,
router_sim_prefill.py for prefill and prefix affinity); a JSON of every run and an SVG of the balance
efficiencies next to DeepSeek's reported ~80% and the perfectly balanced schedule's 100%."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dsgraph.tools.bench.plot import COLORS, _text
from dsgraph.tools.bench.router_sim import DecodeSim, run_decode
from dsgraph.tools.bench.router_sim_prefill import PREFILL_POLICIES, PrefillSim, run_prefill

DECODE_POLICIES = ("random", "round_robin", "least_requests", "balanced")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("router-sim", help="the router's policies simulated over thousands of engines")
    p.add_argument("--out", default="bench/results", help="folder for router-sim.json and router-sim.svg")
    p.add_argument("--decode-engines", default="1024,4096", help="comma list of decode engine counts")
    p.add_argument("--prefill-engines", type=int, default=1024)
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--plot", metavar="JSON", help="only redraw the SVG of a saved result")
    p.set_defaults(func=main)


def _decode_rows(counts: list[int], quick: bool) -> list[dict[str, Any]]:
    rows = []
    for n in counts:
        base = DecodeSim(engines=n, steps=300 if quick else DecodeSim.steps)
        runs = [(pol, base) for pol in DECODE_POLICIES]
        runs += [(f"balanced, poll every {k} steps", replace(base, poll_steps=k)) for k in (1, 200)]
        for name, sim in runs:
            t = time.time()
            result = run_decode(sim, name.split(",")[0])
            rows.append(
                {"part": "decode", "policy": name, "sim": asdict(sim), **result, "wall_s": time.time() - t}
            )
            print(f"decode {n:5d} engines  {name:32s} efficiency {result['efficiency']:.3f}", flush=True)
    return rows


def _prefill_rows(engines: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for shared in (True, False):
        sim = PrefillSim(engines=engines, shared_store=shared, steps=300 if quick else PrefillSim.steps)
        for pol in PREFILL_POLICIES:
            t = time.time()
            result = run_prefill(sim, pol)
            rows.append(
                {"part": "prefill", "policy": pol, "sim": asdict(sim), **result, "wall_s": time.time() - t}
            )
            store = "shared store" if shared else "no shared store"
            print(
                f"prefill {engines} engines, {store:15s} {pol:20s} efficiency {result['efficiency']:.3f} "
                f"TTFT mean {result['ttft_mean_s']:.2f} s p99 {result['ttft_p99_s']:.2f} s",
                flush=True,
            )
    return rows


def _label(row: dict[str, Any]) -> str:
    sim = row["sim"]
    if row["part"] == "decode":
        return f"decode, {sim['engines']} engines: {row['policy']}"
    store = "shared store" if sim["shared_store"] else "no store"
    return f"prefill, {sim['engines']} engines, {store}: {row['policy']}"


def efficiency_svg(rows: list[dict[str, Any]], title: str) -> str:
    """Horizontal bars of balance efficiency from 50% (the axis' left end) to 100%, one per run, with
    the 80% and 100% marks."""
    left, bar, width, low = 400, 18, 360, 0.5
    scale = lambda e: max(0.0, e - low) / (1 - low) * width  # noqa: E731
    height = 70 + bar * len(rows) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 80}" height="{height}" '
        'font-family="sans-serif">',
        f'<rect width="{left + width + 80}" height="{height}" fill="white"/>',
        _text(10, 24, title, 14),
    ]
    for mark, name in ((low, "50%"), (0.8, "DeepSeek ~80%"), (1.0, "perfect balance")):
        x = left + scale(mark)
        parts.append(
            f'<line x1="{x:.1f}" y1="40" x2="{x:.1f}" y2="{height - 25}" stroke="#888" stroke-dasharray="4"/>'
        )
        parts.append(_text(x, height - 10, name, 10, 'text-anchor="middle"'))
    parts_of = {"decode": 0, "prefill": 1}
    for i, row in enumerate(rows):
        y = 50 + i * bar
        eff = row["efficiency"]
        color = COLORS[parts_of[row["part"]] % len(COLORS)]
        parts.append(_text(left - 6, y + 12, _label(row), 11, 'text-anchor="end"'))
        parts.append(
            f'<rect x="{left}" y="{y + 2}" width="{eff * width:.1f}" height="{bar - 4}" fill="{color}"/>'
        )
        parts.append(_text(left + eff * width + 4, y + 12, f"{eff:.1%}", 10))
    return "\n".join([*parts, "</svg>"]) + "\n"


TITLE = "dsgraph router: balance efficiency vs. a perfectly balanced schedule (simulated)"


def main(args: argparse.Namespace) -> int:
    if args.plot:
        path = Path(args.plot)
        path.with_suffix(".svg").write_text(efficiency_svg(json.loads(path.read_text())["runs"], TITLE))
        print(f"wrote {path.with_suffix('.svg')}")
        return 0
    counts = [int(x) for x in args.decode_engines.split(",")]
    if args.quick:
        counts = [min(c, 256) for c in counts[:1]]
    rows = _decode_rows(counts, args.quick) + _prefill_rows(
        128 if args.quick else args.prefill_engines, args.quick
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "router-sim-quick" if args.quick else "router-sim"
    (out / f"{name}.json").write_text(json.dumps({"runs": rows}, indent=1) + "\n")
    (out / f"{name}.svg").write_text(efficiency_svg(rows, TITLE))
    print(f"wrote {out / (name + '.json')} and {out / (name + '.svg')}")
    return 0
