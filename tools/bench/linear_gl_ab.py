"""A/B of the Gluon decode FP8 linear (linear_gl.py) against the default Triton swapped tiles.

`python -m dsgraph.tools.bench.linear_gl_ab --out FILE.json [--shapes wo_b,wq_b] [--ms 1,16]` runs, for
each FP8 linear shape of linear_sweep.SHAPES at decode row counts, the default kernel (the tiles
linear.tiles_for picks, the weight's k_splits) and the Gluon kernel at every CONFIGS entry on the same
bf16 operands (the graphs quantize a GEMM input with its own act_qdq first), in CUDA graphs over enough
weight copies to pass the L2 cache. Each figure: time, weight bytes / time as a fraction of the copy rate
measured in the same run, the speed-up over the default and whether the output bits are equal (they must
be: the same arithmetic). `attn.wo_b f32` is wo_b with an f32 input split into three bf16 pieces (the
graphs' before b87122d; the JSON at 908dd6e names them `attn.wo_b` and `attn.wo_b bf16`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from dsgraph.tools.bench import linear_sweep as ls

CONFIGS = ((128, 3), (128, 4), (256, 3), (64, 6))  # (BLOCK_K, STAGES)


def _shapes(wanted: list[str]) -> list[ls.Shape]:
    fp8 = [s for s in ls.SHAPES if s.act != "dense" and s.per_layer > 0]
    wo_b = next(s for s in fp8 if s.name == "attn.wo_b")
    shapes = [*fp8, dataclasses.replace(wo_b, name="attn.wo_b f32", act="f32")]
    return [s for s in shapes if not wanted or any(w in s.name for w in wanted)]


def _operand(s: ls.Shape, x: torch.Tensor, m: int) -> torch.Tensor:
    """The activation the GEMM kernel reads: bf16 FP8-g32 values, or wo_b's f32 (split into pieces)."""
    from dsgraph.platform.cuda.kernels import linear_bf16_tl

    x3 = x.reshape(m, s.groups, s.k).float().contiguous()
    return x3 if s.act == "f32" else linear_bf16_tl.qdq_rows(x3)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def ab_row(s: ls.Shape, m: int, cal: Any) -> dict[str, Any]:
    from dsgraph.platform.cuda.kernels import linear as lin
    from dsgraph.platform.cuda.kernels import linear_bf16_tl
    from dsgraph.tools.bench import linear_gl
    from dsgraph.tools.bench.timing import graph_time_ms

    splits, wbytes = lin.k_splits(s.groups, s.n, s.k), s.groups * s.n * s.k
    copies = max(1, min(ls.MAX_COPIES, -(-ls.PASS_L2_BYTES // wbytes)))
    x, weights = ls._inputs(s, m, copies)
    x3 = _operand(s, x, m)
    ws = [(w, scale.view(torch.uint8)) for w, scale in weights]
    dtype = torch.bfloat16 if s.out == "bf16" else torch.float32
    outs = [torch.empty((m, s.groups, s.n), dtype=dtype, device="cuda") for _ in range(copies)]
    tiles = lin.tiles_for(m)

    def default(i: int) -> None:
        linear_bf16_tl.launch(x3, ws[i][0], ws[i][1], outs[i], False, tiles, splits)

    def frac(ms: float) -> float:
        return wbytes / (ms * 1e-3) / 1e9 / cal.copy_gbps

    default(0)
    ref = outs[0].clone()
    base = graph_time_ms(lambda: [default(i) for i in range(copies)], repeats=5) / copies
    row = {"shape": s.name, "m": m, "n": s.n, "k": s.k, "groups": s.groups, "splits": splits, "act": s.act}
    row |= {"weight_bytes": wbytes, "default_ms": base, "default_fraction_of_copy": frac(base), "gluon": []}
    for block_k, stages in CONFIGS:
        if (s.k // splits) % block_k:
            continue
        entry: dict[str, Any] = {"block_k": block_k, "stages": stages}

        def gluon(i: int, bk: int = block_k, st: int = stages) -> None:
            linear_gl.launch(x3, ws[i][0], ws[i][1], outs[i], splits, 16, bk, st)

        try:
            outs[0].zero_()
            gluon(0)
            entry["bit_equal"] = bool(torch.equal(_bits(outs[0]), _bits(ref)))
            ms = graph_time_ms(lambda g=gluon: [g(i) for i in range(copies)], repeats=5) / copies
            entry |= {"ms": ms, "fraction_of_copy": frac(ms), "speedup": base / ms}
        except Exception as exc:  # a config that fails to compile or launch is reported, not fatal
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row["gluon"].append(entry)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--shapes", default="", help="comma-separated name substrings (default: every FP8 one)")
    ap.add_argument("--ms", default="1,8,16", help="comma-separated row counts (at most 16)")
    args = ap.parse_args(argv)
    from dsgraph.tools.bench.calibrate import calibrate
    from dsgraph.tools.bench.meta import commit

    ms = [int(v) for v in args.ms.split(",")]
    if max(ms) > 16:
        raise SystemExit(f"--ms: the Gluon kernel runs 16-row activation tiles, got {max(ms)} rows")
    cal = calibrate()
    rows = []
    for s in _shapes([w for w in args.shapes.split(",") if w]):
        for m in ms:
            rows.append(ab_row(s, m, cal))
            print(json.dumps(rows[-1]), flush=True)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    result = {"bench": "linear_gl_ab", "gpu": torch.cuda.get_device_name(), "commit": commit(), "date": when}
    result |= {"calibration": cal.as_dict(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    ok = all(g.get("bit_equal", False) for r in rows for g in r["gluon"])
    print(f"wrote {args.out}; bits {'equal' if ok else 'DIFFER'} everywhere")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
