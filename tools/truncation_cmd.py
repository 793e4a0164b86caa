"""`dsgraph truncation-check`: the prefill truncation equivalence checks. L1 (step metadata, no weights,
seconds; tools/truncation_l1.py) and L2 (teacher-forced log-probabilities and DSpark confidences on a
checkpoint, default the embedded tiny model; tools/truncation_l2.py). Prints a report (JSON with
`--json`); exits 1 when a check fails."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def run_checks(level: str, model_dir: Path | None, bound: float) -> tuple[bool, dict[str, Any]]:
    from dsgraph.tools.truncation_l1 import run_l1

    out: dict[str, Any] = {}
    ok = True
    if level in ("l1", "all"):
        l1 = run_l1()
        out["l1"] = {"ok": l1.ok, "text": l1.as_text()}
        ok &= l1.ok
    if level in ("l2", "all"):
        from dsgraph.tools.generate_cmd import default_model_dir
        from dsgraph.tools.truncation_l2 import compare_l2, run_mode

        root = model_dir or default_model_dir()
        figures = compare_l2({m: run_mode(root, m) for m in ("off", "mask", "compact")})
        within = figures["max_golden_logprob_diff_vs_off"] <= bound
        l2_ok = bool(
            figures["mask_equals_compact"]
            and figures["confidence_mask_equals_compact"]
            and within
            and figures["truncated_steps"] > 0
        )
        out["l2"] = {"ok": l2_ok, "bound_nats": bound, **figures}
        ok &= l2_ok
    return ok, out


def main(args: argparse.Namespace) -> int:
    ok, out = run_checks(args.level, Path(args.model) if args.model else None, args.bound)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        if "l1" in out:
            print(out["l1"]["text"], end="")
        if "l2" in out:
            print("L2 " + ("OK" if out["l2"]["ok"] else "FAILED") + ": " + json.dumps(out["l2"]))
    return 0 if ok else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    from dsgraph.runtime.prefill_truncation import BOUND_NATS

    p = sub.add_parser(
        "truncation-check", help="prefill truncation equivalence checks (L1 metadata, L2 values)"
    )
    p.add_argument("--level", choices=["l1", "l2", "all"], default="all")
    p.add_argument("--model", default=None, help="checkpoint for L2 (default: the embedded tiny model)")
    p.add_argument(
        "--bound",
        type=float,
        default=BOUND_NATS,
        help="largest allowed change of a golden token's log-prob against off (nats)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)
