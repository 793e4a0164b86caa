"""The indexer's selections on the GPU: the cuda rules (select_tl.py radix selects) against the cpu rules
run on the same device tensors (torch's stable sort), captured into CUDA graphs, same run, same inputs.

Rows 1..64 (decode) and 4096 (a prefill chunk) over entry widths of an 8k, 32k and 128k context at
ratio 4 (2,048, 8,192 and 32,768 entries); top-k 512, candidate blocks of 8 keeping 2,048. Scores are
rounded to integers so that ties are many. Each case checks that both give the same result.

Usage: python -m dsgraph.tools.bench.select_cmp [--out bench/results/select-cmp.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from dsgraph.platform.cpu import rules_attention as cpu
from dsgraph.platform.cuda.kernels import indexer
from dsgraph.tools.bench.run import environment
from dsgraph.tools.bench.timing import graph_time_ms

ROWS = (1, 8, 64, 4096)
WIDTHS = (2048, 8192, 32768)
TOPK = SimpleNamespace(k=512)
CANDIDATES = SimpleNamespace(block_size=8, topk_blocks=2048)


def _scores(rows: int, width: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + width)
    scores = (torch.randn(rows, width, device="cuda", generator=g) * 20).round()
    visible = torch.arange(width, device="cuda") < (width * 7) // 8  # the newest entries not yet written
    return torch.where(visible, scores, float("-inf"))


def _case(op: str, rows: int, width: int) -> dict[str, Any]:
    scores = _scores(rows, width)
    p = TOPK if op == "topk_select" else CANDIDATES
    ours, ref = getattr(indexer, op), getattr(cpu, op)
    same = bool(torch.equal(ours(p, scores), ref(p, scores)))
    ours_ms = graph_time_ms(lambda: ours(p, scores))
    ref_ms = graph_time_ms(lambda: ref(p, scores))
    return {"op": op, "rows": rows, "width": width, "same": same, "ms": ours_ms, "sort_ms": ref_ms,
            "speedup_over_sort": ref_ms / ours_ms}  # fmt: skip


def measure() -> dict[str, Any]:
    cases = []
    for op in ("topk_select", "candidate_mask"):
        for width in WIDTHS:
            for rows in ROWS:
                if rows * width > 4096 * 8192:  # the sort's temporaries at 4096 x 32k: past the point
                    continue
                cases.append(_case(op, rows, width))
                print(json.dumps(cases[-1]), flush=True)
                torch.cuda.empty_cache()
    return {"bench": "select_cmp", **environment(), "cases": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/select-cmp.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("select_cmp: no CUDA device (this times the cuda platform's selection kernels)")
    result = measure()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
