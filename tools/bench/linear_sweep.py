"""Tile sweep of the FP8 block-scaled linear (platform/cuda/kernels/linear.py) at V4.1's shapes.

`python -m dsgraph.tools.bench.linear_sweep --out DIR` times, for every shape the model's linears use
(hidden 5120) and M = 1, 8, 64, 256, 4096 rows, the tiles TILE_TABLE picks, its prefill entry (the
reference) and every CANDIDATES entry of M's class, next to `torch._scaled_mm` (per-tensor scales, the dense
FP8 ceiling; bf16 matmul for the dense weights) on the same shape. Each figure: ms per call, weight bytes /
time as a fraction of the copy bandwidth and TFLOP/s as a fraction of the FP8 GEMM rate, both measured
in the same run (calibrate.py). Calls are timed as CUDA-graph replays over enough weight copies to pass
the L2 cache (a decode step streams its weights from HBM). Every config's output is compared with the
reference's output: `bit_equal` (what batch invariance across M classes needs when both serve) and
`within_tol` (twice the GPU test tolerance of tests/cuda/test_linear.py). Kernels are compiled first in
a pool of processes (Triton's disk cache), so one run stays near a minute on an H200.
Split policies (POLICIES: linear.py's split constants, the default first) are timed apart with the
table's tiles at POLICY_MS rows: a policy changes the bits of the weights whose split count it changes,
so each is checked for batch invariance within itself (decode tiles against the prefill tiles under the
same policy) and reported with its per-layer time at decode and prefill row counts.
Writes DIR/linear_sweep.json and prints one line per (shape, M, config), a per-layer summary, a decode
table (per shape and M: the table pick's and the best bit-equal config's fraction of copy bandwidth) and
the policies' per-layer times.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from dsgraph.platform.cpu import rules_core
from dsgraph.platform.cuda.kernels import linear as lin
from dsgraph.platform.cuda.kernels.linear import Tiles

MS = (1, 8, 64, 256, 4096)
PASS_L2_BYTES = 256 << 20  # weight copies per timed graph: at least this many bytes (H200 L2: 50 MB)
MAX_COPIES = 32


@dataclass(frozen=True)
class Shape:
    """One linear of the model: N x K weight (per group), the activation path, output dtype, row counts
    timed and how many such calls one layer makes (the summary's weights)."""

    name: str
    n: int
    k: int
    groups: int = 1
    act: str = "fp8"  # fp8: bf16 x, act_quant fp8_g32; f32: f32 x, act_quant none (split); dense: bf16 w
    out: str = "bf16"
    ms: tuple[int, ...] = MS
    per_layer: float = 1.0


SHAPES = (
    Shape("attn.wq_a", 1280, 5120),
    Shape("attn.wq_b", 32768, 1280),  # also the (4096, 32768, 1280) prefill shape
    Shape("attn.wkv", 512, 5120),
    Shape("attn.wo_a", 1024, 4096, groups=8, out="f32"),
    Shape("attn.wo_b", 5120, 8192),  # its input FP8-g32 values in bf16 (f32 split into pieces before b87122d)
    Shape("indexer.wq_b", 4096, 1280, per_layer=0.2),  # Full and Reindex layers: 8 of 40
    Shape("shared.w1/w3", 2304, 5120, per_layer=2.0),
    Shape("shared.w2", 5120, 2304),
    Shape("ffn.gate", 384, 5120, act="dense", out="f32", ms=(1, 8, 64, 256)),
    Shape("head", 129280, 5120, act="dense", out="f32", ms=(1, 8, 64), per_layer=0.0),
    Shape("fp8 16k x 5120 x 8192", 5120, 8192, ms=(16384,), per_layer=0.0),
)


def _params(s: Shape) -> Any:
    fmt = "dense" if s.act == "dense" else "fp8_block32"
    return SimpleNamespace(
        weight_format=fmt, act_quant="fp8_g32" if s.act == "fp8" else "none", out_dtype=s.out
    )


def _inputs(s: Shape, m: int, copies: int, fill: bool = True) -> tuple[torch.Tensor, list[tuple]]:
    """x [m, (G,) K] and `copies` weight tuples (w[, UE8M0 scales with varied exponents])."""
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + s.n)
    rows, dev = s.groups * s.n, "cuda"
    x_dtype = torch.float32 if s.act == "f32" else torch.bfloat16
    x_shape = (m, s.groups, s.k) if s.groups > 1 else (m, s.k)
    x = (
        torch.randn(x_shape, generator=gen, device=dev).to(x_dtype)
        if fill
        else torch.empty(x_shape, dtype=x_dtype, device=dev)
    )
    weights = []
    for _ in range(copies):
        w = (
            torch.randn(rows, s.k, generator=gen, device=dev) * s.k**-0.5
            if fill
            else torch.empty(rows, s.k, device=dev)
        )
        if s.act == "dense":
            weights.append((w.bfloat16(),))
            continue
        scale = torch.randint(118, 130, (-(-rows // 32), -(-s.k // 32)), generator=gen, device=dev)
        weights.append((w.to(torch.float8_e4m3fn), scale.to(torch.uint8).view(torch.float8_e8m0fnu)))
    return x, weights


def _call(s: Shape, x: torch.Tensor, w: tuple, tiles: Tiles) -> torch.Tensor:
    rule = lin.grouped_linear if s.groups > 1 else lin.linear
    return rule(_params(s), x, *w, tiles=tiles)


# Candidates per M class (the bounds of linear.TILE_TABLE); every one gives the table's bits (one
# arithmetic: linear_bf16_tl.py), which the sweep checks. Swapped tiles serve decode batches.
W = True  # Tiles.wide: the whole BLOCK_K step loaded and dequantized at once
CANDIDATES: dict[int, tuple[Tiles, ...]] = {
    16: (Tiles(16, 128, 64, 8, 4, True), Tiles(16, 64, 256, 4, 3, True), Tiles(16, 128, 128, 4, 4, True),
         Tiles(16, 128, 64, 8, 4, True, W), Tiles(16, 128, 128, 8, 4, True, W),
         Tiles(16, 128, 128, 8, 2, True, W), Tiles(16, 128, 256, 8, 1, True, W),
         Tiles(16, 64, 256, 4, 3, True, W), Tiles(16, 64, 256, 4, 1, True, W),
         Tiles(16, 128, 128, 4, 4, True, W)),
    256: (Tiles(64, 128, 32, 8, 4, True), Tiles(64, 64, 128, 4, 4, True), Tiles(64, 128, 64, 4, 4, True),
          Tiles(64, 128, 64, 8, 4, True, W), Tiles(64, 128, 128, 8, 3, True, W),
          Tiles(64, 128, 128, 8, 1, True, W), Tiles(64, 64, 128, 4, 1, True, W),
          Tiles(64, 64, 128, 4, 4, True, W), Tiles(32, 128, 128, 8, 3, True, W)),
    1 << 62: (Tiles(128, 128, 64, 8, 3), Tiles(256, 128, 64, 8, 3), Tiles(128, 256, 64, 8, 3),
              Tiles(128, 128, 64, 4, 4)),
}  # fmt: skip


class SplitPolicy(NamedTuple):
    """linear.py's split constants: the count of K ranges is a function of the weight's shape alone, so a
    policy is a whole-model choice (each row's bits follow it, for every M)."""

    tile_n: int  # SPLIT_TILE_N
    target: int  # SPLIT_TARGET
    max_splits: int  # MAX_SPLITS
    min_split: int  # MIN_SPLIT


def current_policy() -> SplitPolicy:
    return SplitPolicy(lin.SPLIT_TILE_N, lin.SPLIT_TARGET, lin.MAX_SPLITS, lin.MIN_SPLIT)


# Split policies timed with the table's tiles: programs counted per 64 or 128 weight rows (the swapped
# tiles' block_n), up to 20 ranges of at least 256 columns.
POLICIES = (SplitPolicy(64, 264, 20, 256), SplitPolicy(128, 264, 20, 256), SplitPolicy(128, 132, 10, 512))
POLICY_MS = (1, 64, 4096)  # decode and prefill: the same split serves every M


@contextmanager
def split_policy(policy: SplitPolicy) -> Iterator[None]:
    """linear.py's split constants set to `policy` for the duration (the sweep's switch only)."""
    saved = current_policy()
    names = ("SPLIT_TILE_N", "SPLIT_TARGET", "MAX_SPLITS", "MIN_SPLIT")
    try:
        for name, value in zip(names, policy, strict=True):
            setattr(lin, name, value)
        yield
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(lin, name, value)


def candidates() -> list[Tiles]:
    return sorted({t for c in CANDIDATES.values() for t in c})


def _reference() -> Tiles:
    """The tiles every config is compared with bit for bit (the prefill entry of the table)."""
    return lin.TILE_TABLE[-1][1]


def _configs(s: Shape, m: int) -> list[Tiles]:
    """The table's pick, the reference, then M's class candidates (dense weights: the dense table's)."""
    if s.act == "dense":
        return [lin.tiles_for(m, dense=True)]
    bound = next((b for b, _ in lin.TILE_TABLE if m <= b), lin.TILE_TABLE[-1][0])
    out: list[Tiles] = []
    for t in (lin.tiles_for(m), _reference(), *CANDIDATES.get(bound, ())):
        if t not in out:
            out.append(t)
    return out


def _warm_one(task: tuple[Shape, int, Tiles, SplitPolicy]) -> str | None:
    """Compile one (shape, M, tiles, split policy) by launching it once (fills Triton's disk cache)."""
    s, m, tiles, policy = task
    try:
        x, w = _inputs(s, m, 1, fill=False)
        with split_policy(policy):
            _call(s, x, w[0], tiles)
        torch.cuda.synchronize()
    except Exception as exc:  # reported in the timing pass too; a failed compile must not end the sweep
        return f"{s.name} m={m} {tuple(tiles)}: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def _policy_shapes(shapes: list[Shape]) -> list[Shape]:
    """The FP8 shapes the split policies are timed on, at POLICY_MS rows."""
    return [replace(s, ms=POLICY_MS) for s in shapes if s.act != "dense" and s.per_layer > 0]


def precompile(shapes: list[Shape], workers: int, policies: tuple[SplitPolicy, ...]) -> list[str]:
    now = current_policy()
    tasks = [(s, m, t, now) for s in shapes for m in s.ms for t in _configs(s, m)]
    tasks += [(s, m, t, p) for p in policies for s in _policy_shapes(shapes) for m in s.ms
              for t in {lin.tiles_for(m), _reference()}]  # fmt: skip
    if workers <= 1:
        return [e for e in map(_warm_one, tasks) if e]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return [e for e in pool.map(_warm_one, tasks, chunksize=2) if e]


def _time_calls(fn: Any, copies: int) -> float:
    from dsgraph.tools.bench.timing import graph_time_ms

    return graph_time_ms(lambda: [fn(i) for i in range(copies)], repeats=5) / copies


def _reference_ms(s: Shape, x: torch.Tensor, weights: list[tuple]) -> float:
    """_scaled_mm (rows padded to 16) on the same FP8 operands, per group; bf16 matmul for dense."""
    if s.act == "dense":
        return _time_calls(lambda i: x @ weights[i][0].t(), len(weights))
    x2 = x.reshape(x.shape[0], -1, s.k)[:, 0]
    x8 = torch.nn.functional.pad(x2.float(), (0, 0, 0, -x2.shape[0] % 16)).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")

    def call(i: int) -> None:
        w = weights[i][0]
        for g in range(s.groups):
            torch._scaled_mm(x8, w[g * s.n : (g + 1) * s.n].t(), one, one, out_dtype=torch.bfloat16)

    return _time_calls(call, len(weights))


def _bound(s: Shape, x: torch.Tensor, w: tuple, ref: torch.Tensor) -> torch.Tensor:
    """Twice the GPU test's bound (test_linear.py) around `ref`: two results each within it of the exact
    one differ by at most this much."""
    xf, wf = rules_core.linear_operands(_params(s), x, *w)
    if s.groups > 1:
        abs_sum = torch.einsum("tgk,gnk->tgn", xf.abs(), wf.reshape(s.groups, s.n, s.k).abs())
    else:
        abs_sum = xf.abs() @ wf.abs().t()
    acc = (2.0**-10 if s.act == "fp8" else 2.0**-16) + 2 * s.k * 2.0**-24
    return 2 * (acc * abs_sum + torch.finfo(ref.dtype).eps * ref.float().abs())


def sweep_shape(s: Shape, m: int, cal: Any) -> dict[str, Any]:
    wbytes = s.groups * s.n * s.k * (2 if s.act == "dense" else 1)
    copies = max(1, min(MAX_COPIES, -(-PASS_L2_BYTES // wbytes)))
    x, weights = _inputs(s, m, copies)
    flops = 2 * m * s.groups * s.n * s.k
    row: dict[str, Any] = {"shape": s.name, "m": m, "n": s.n, "k": s.k, "groups": s.groups, "act": s.act}
    row |= {"out": s.out, "weight_bytes": wbytes, "copies": copies, "configs": []}
    current = _call(s, x, weights[0], _configs(s, m)[0] if s.act == "dense" else _reference())
    bound = _bound(s, x, weights[0], current)
    for tiles in _configs(s, m):
        entry: dict[str, Any] = {"tiles": list(tiles), "table_pick": tiles == _configs(s, m)[0]}
        try:
            ms = _time_calls(lambda i, t=tiles: _call(s, x, weights[i], t), copies)
            y = _call(s, x, weights[0], tiles)
        except Exception as exc:  # a config that fails to compile or launch is reported, not fatal
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            row["configs"].append(entry)
            continue
        excess = float(((y.float() - current.float()).abs() - bound).max())
        entry |= {"ms": ms, "fraction_of_copy": wbytes / (ms * 1e-3) / 1e9 / cal.copy_gbps}
        entry |= {"tflops": flops / (ms * 1e-3) / 1e12}
        entry |= {"fraction_of_fp8_gemm": entry["tflops"] / cal.fp8_gemm_tflops}
        entry |= {"bit_equal": bool(torch.equal(y, current)), "within_tol": excess <= 0, "tol_excess": excess}
        row["configs"].append(entry)
    try:
        ref = _reference_ms(s, x, weights)
        row |= {
            "reference_ms": ref,
            "reference_fraction_of_copy": wbytes / (ref * 1e-3) / 1e9 / cal.copy_gbps,
        }
    except Exception as exc:
        row["reference"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return row


def sweep_policy(s: Shape, m: int, cal: Any, policy: SplitPolicy) -> dict[str, Any]:
    """The table's tiles for M under `policy`: time, fraction of copy, and bits against the default
    policy's result (equal only where the split count is the same) and against the prefill tiles under
    the same policy (batch invariance within the policy: must hold)."""
    wbytes = s.groups * s.n * s.k
    copies = max(1, min(MAX_COPIES, -(-PASS_L2_BYTES // wbytes)))
    x, weights = _inputs(s, m, copies)
    default = _call(s, x, weights[0], lin.tiles_for(m))
    row: dict[str, Any] = {"shape": s.name, "m": m, "policy": list(policy), "weight_bytes": wbytes}
    row["splits_default"] = lin.k_splits(s.groups, s.n, s.k)
    with split_policy(policy):
        row["splits"] = lin.k_splits(s.groups, s.n, s.k)
        try:
            ms = _time_calls(lambda i: _call(s, x, weights[i], lin.tiles_for(m)), copies)
            y = _call(s, x, weights[0], lin.tiles_for(m))
            ref = _call(s, x, weights[0], _reference())
        except Exception as exc:
            return row | {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    row |= {"ms": ms, "fraction_of_copy": wbytes / (ms * 1e-3) / 1e9 / cal.copy_gbps}
    row |= {
        "bit_equal_default": bool(torch.equal(y, default)),
        "bit_equal_same_split": bool(torch.equal(y, ref)),
    }
    return row


def sweep_in_program(s: Shape, m: int, cal: Any) -> dict[str, Any]:
    """A weight whose K is split (linear.k_splits) at the prefill tiles: its ranges summed by a program
    each plus the last range's sum, against one program summing them one after the other (the default
    where linear_bf16_tl.sums_in_program allows it): time of each, and their bits (must be equal)."""
    from dsgraph.platform.cuda.kernels import linear_bf16_tl

    tiles, splits = _reference(), lin.k_splits(s.groups, s.n, s.k)
    x, weights = _inputs(s, m, 1)
    x3, (w, scale) = x.reshape(m, s.groups, s.k).contiguous(), weights[0]
    out_dtype, bits = (torch.bfloat16, torch.int16) if s.out == "bf16" else (torch.float32, torch.int32)
    flops = 2 * m * s.groups * s.n * s.k
    row: dict[str, Any] = {"shape": s.name, "m": m, "splits": splits, "tiles": list(tiles)}
    out = {}
    for in_program, name in ((False, "per_range"), (True, "in_program")):
        y = torch.empty((m, s.groups, s.n), dtype=out_dtype, device="cuda")
        args = (x3, w, scale.view(torch.uint8), y, s.act == "fp8", tiles, splits, in_program)
        ms = _time_calls(lambda _, a=args: linear_bf16_tl.launch(*a), 1)
        linear_bf16_tl.launch(*args)
        out[in_program] = y.view(bits).clone()
        row |= {f"{name}_ms": ms, f"{name}_tflops": flops / (ms * 1e-3) / 1e12}
    row["speedup"] = row["per_range_ms"] / row["in_program_ms"]
    row["bit_equal"] = bool(torch.equal(out[True], out[False]))
    row["fraction_of_fp8_gemm"] = row["in_program_tflops"] / cal.fp8_gemm_tflops
    return row


def decode_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, M): the table pick's and the best bit-equal config's fraction of copy bandwidth."""
    out = []
    for r in rows:
        ok = [c for c in r["configs"] if "ms" in c]
        if not ok:
            continue
        pick = next((c for c in ok if c["table_pick"]), ok[0])
        best = min((c for c in ok if c["bit_equal"]), key=lambda c: c["ms"], default=pick)
        out.append({"shape": r["shape"], "m": r["m"], "pick_copy": round(pick["fraction_of_copy"], 4),
                    "pick_us": round(pick["ms"] * 1e3, 2), "best_copy": round(best["fraction_of_copy"], 4),
                    "best_us": round(best["ms"] * 1e3, 2), "best_tiles": best["tiles"],
                    "all_bit_equal": all(c["bit_equal"] for c in ok)})  # fmt: skip
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per M: one layer's linear time (Shape.per_layer weights) with the reference, with the table's pick,
    and with the best timed config per shape; and per config of M's class, the layer time where timed."""
    weight = {s.name: s.per_layer for s in SHAPES}
    out: dict[str, Any] = {}
    for m in sorted({r["m"] for r in rows}):
        sums: dict[str, float] = {"current": 0.0, "table": 0.0, "best": 0.0}
        per_config: dict[str, float] = {}
        for r in (r for r in rows if r["m"] == m and weight.get(r["shape"], 0) > 0):
            ok = [c for c in r["configs"] if "ms" in c]
            if not ok:
                continue
            f = weight[r["shape"]]
            sums["current"] += f * ok[0]["ms"]
            sums["table"] += f * next((c["ms"] for c in ok if c["table_pick"]), ok[0]["ms"])
            sums["best"] += f * min(c["ms"] for c in ok)
            for c in ok:
                key = str(tuple(c["tiles"][:5])) + (" swapped" if c["tiles"][5] else "")
                key += " wide" if c["tiles"][6] else ""
                per_config[key] = per_config.get(key, 0.0) + f * c["ms"]
        out[str(m)] = {
            "layer_ms": sums,
            "layer_ms_by_config": dict(sorted(per_config.items(), key=lambda kv: kv[1])),
        }
    return out


def policy_summary(policy_rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per policy and M: one layer's FP8 linear time (Shape.per_layer weights); batch invariance within
    the policy must hold for every row ("invariant")."""
    weight = {s.name: s.per_layer for s in SHAPES}
    out: dict[str, dict[str, float]] = {}
    for r in (r for r in policy_rows if "ms" in r):
        entry = out.setdefault(str(tuple(r["policy"])), {"invariant": True})
        entry[str(r["m"])] = entry.get(str(r["m"]), 0.0) + weight[r["shape"]] * r["ms"]
        entry["invariant"] = entry["invariant"] and r["bit_equal_same_split"]
    return out


def _print_row(r: dict[str, Any]) -> None:
    ref = f"ref {r['reference_ms']:.4f} ms" if "reference_ms" in r else r.get("reference", "")
    print(f"{r['shape']:>22} m={r['m']:<6} n={r['n']} k={r['k']} g={r['groups']} ({ref})", flush=True)
    for c in r["configs"]:
        if "error" in c:
            print(f"    {c['tiles']}: {c['error']}", flush=True)
            continue
        flag = (
            "" if c["bit_equal"] else (" DIFFERS (within tol)" if c["within_tol"] else " DIFFERS BEYOND TOL")
        )
        pick = " *" if c["table_pick"] else ""
        print(
            f"    {str(c['tiles']):<46}{c['ms']:9.4f} ms  {c['fraction_of_copy']:6.1%} copy  "
            f"{c['tflops']:7.1f} TF/s {c['fraction_of_fp8_gemm']:6.1%}{pick}{flag}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ms", type=str, default="", help="comma-separated row counts (default: each shape's)")
    ap.add_argument("--shapes", type=str, default="", help="comma-separated name substrings")
    ap.add_argument("--no-policies", action="store_true", help="skip the split policies (POLICIES)")
    ap.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument(
        "--in-program-ab",
        action="store_true",
        help="only time the split weights at --ms rows (default 4096, 16384) with their K ranges summed "
        "by a program each and in one program, same tiles (writes linear_in_program.json)",
    )
    args = ap.parse_args(argv)
    if args.in_program_ab:
        return in_program_ab(args)
    from dsgraph.tools.bench.calibrate import calibrate

    wanted = [w for w in args.shapes.split(",") if w]
    shapes = [s for s in SHAPES if not wanted or any(w in s.name for w in wanted)]
    if args.ms:
        ms = tuple(int(v) for v in args.ms.split(","))
        shapes = [replace(s, ms=ms) for s in shapes]
    start = time.time()
    policies = () if args.no_policies else (current_policy(), *POLICIES)  # the default first: the baseline
    errors = precompile(shapes, args.workers, policies)
    compiled_s = time.time() - start
    cal = calibrate()
    rates = f"copy {cal.copy_gbps:.0f} GB/s, fp8 GEMM {cal.fp8_gemm_tflops:.0f} TF/s"
    print(f"compiled in {compiled_s:.1f} s ({len(errors)} failures); {rates}", flush=True)
    rows = []
    for s in shapes:
        for m in s.ms:
            rows.append(sweep_shape(s, m, cal))
            _print_row(rows[-1])
    policy_rows = [sweep_policy(s, m, cal, p) for p in policies for s in _policy_shapes(shapes) for m in s.ms]
    for r in policy_rows:
        print(json.dumps(r), flush=True)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "calibration": cal.as_dict(),
        "tile_table": [[b, list(t)] for b, t in lin.TILE_TABLE],
        "reference": list(_reference()),
        "compile_errors": errors,
        "compile_s": compiled_s,
        "total_s": time.time() - start,
        "rows": rows,
        "summary": summary(rows),
        "decode_table": decode_table(rows),
        "split_policy": list(current_policy()),
        "policy_rows": policy_rows,
        "policy_layer_ms": policy_summary(policy_rows),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "linear_sweep.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    for d in result["decode_table"]:
        print(json.dumps(d), flush=True)
    print(json.dumps(result["policy_layer_ms"], indent=1))
    print(f"total {result['total_s']:.1f} s; wrote {args.out / 'linear_sweep.json'}")
    return 0


def in_program_ab(args: argparse.Namespace) -> int:
    from dsgraph.tools.bench.calibrate import calibrate

    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else (4096, 16384)
    split = [s for s in SHAPES if s.act != "dense" and lin.k_splits(s.groups, s.n, s.k) > 1]
    cal = calibrate()
    rows = [sweep_in_program(s, m, cal) for s in split for m in ms]
    for r in rows:
        print(json.dumps(r), flush=True)
    from dsgraph.tools.bench.meta import commit

    when = time.strftime("%Y-%m-%d %H:%M:%S")
    result = {"gpu": torch.cuda.get_device_name(), "commit": commit(), "date": when,
              "calibration": cal.as_dict(), "rows": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "linear_in_program.json").write_text(json.dumps(result, indent=1))
    return 0 if all(r["bit_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
