"""GPU sweep of `moe_experts` (cuda rule) over candidate kernel variants at V4.1's widths:
`python -m dsgraph.tools.bench.moe_sweep --out DIR` prints one line per (variant, rows) and writes
DIR/moe_sweep.json. A variant is a name of CANDIDATES: "base" (the base kernels) or swap-AB tiles per row
bucket, passed to the rule as its `swap` argument; "swap_ds" is the rule's default (moe.SWAP_BUCKETS).

Hidden 5120, 384 experts of 2304 (random packed MXFP4 weights and UE8M0 scales made on the device), top-6
uniform random routing, W4A8 (act_quant fp8_g32) with BF16 GEMM outputs and an FP32 result, as the
serving graph runs it. Per case: the step time (CUDA-graph replay, tools/bench/timing.py); the bytes of
expert weights and scales the step must read (each touched expert's w1, w3, w2 once) over that time as a
fraction of the copy bandwidth measured in the same run; the FP8-equivalent rate (2 x pairs x 3 x hidden
x inter FLOP) as a fraction of the measured FP8 GEMM rate. Each variant's result is checked against the
base kernels': |variant - base| <= 2 x MOE_GPU_TOL x S, S the bound's magnitude (tests/cuda/bounds.py),
since each is within MOE_GPU_TOL x S of the cpu rule; a failing variant is flagged, not timed.
`--same-bits-as NAME` also records, per case, whether the variant's result has exactly the bits of
variant NAME's (a kernel meant to be bit-equal to the current one is checked against it that way).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from dsgraph.platform.cpu import rules_moe
from dsgraph.platform.cpu.step_rows import rowwise_linear
from dsgraph.platform.cuda.kernels import moe as cuda_moe
from dsgraph.platform.cuda.kernels.moe import SWAP_BUCKETS, SwapBuckets, SwapTiles
from dsgraph.tools.bench.calibrate import copy_bandwidth_gbps, fp8_gemm_tflops
from dsgraph.tools.bench.run import environment
from dsgraph.tools.bench.timing import graph_time_ms

HIDDEN, INTER, EXPERTS, TOPK = 5120, 2304, 384, 6
ROWS = (1, 8, 64, 256, 4096)
MOE_GPU_TOL = 2.0**-6  # tests/cuda/bounds.py (kept here: tests/ is not part of the installed package)
PARAMS = SimpleNamespace(
    swiglu_limit=10.0, weight_format="mxfp4_rows", act_quant="fp8_g32", out_dtype="f32", gemm_out_dtype="bf16"
)

_BIG = 1 << 62
_D64, _D128 = SwapTiles(64, 16, 64, 4, 4), SwapTiles(64, 16, 128, 4, 4)  # decode: 16 rows per tile
_W128, _K128 = SwapTiles(128, 16, 128, 8, 4), SwapTiles(128, 64, 128, 8, 3)
_PREFILL = SWAP_BUCKETS[-1]
DEFAULT = "swap_ds"
# The variants earlier sweeps compared (their names are those of the JSON results under bench/results).
CANDIDATES: dict[str, SwapBuckets | None] = {
    "base": None,  # expert_gemm_kernel with GATED_TILES / DOWN_TILES (FP8 dots, 32-column promotion)
    "swap": ((512, _D64, _D64), _PREFILL),
    "swap_k128": ((512, _D128, _D128), (_BIG, _K128, _K128)),
    "swap_w128": ((512, _W128, _W128), (_BIG, _K128, _K128)),
    "swap_flat": ((_BIG, _D64, _D64),),  # one tile set for every step (no bucket switch)
    DEFAULT: SWAP_BUCKETS,
}
for _buckets in CANDIDATES.values():
    if _buckets is not None:
        cuda_moe.check_buckets(_buckets)


def expert_bytes() -> int:
    """Bytes of one expert's packed w1, w3, w2 and their UE8M0 scales."""
    packed = 3 * INTER * HIDDEN // 2
    return packed + 3 * INTER * HIDDEN // 32


def random_experts(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(w1, w3, w2, s1, s3, s2) on the device: random bytes, scales 2^-9 .. 2^-5 (weights of ~1/sqrt(K))."""

    def packed(*shape: int) -> torch.Tensor:
        return torch.randint(-128, 128, shape, dtype=torch.int8, device="cuda", generator=gen)

    def scales(*shape: int) -> torch.Tensor:
        return torch.randint(118, 123, shape, dtype=torch.uint8, device="cuda", generator=gen).view(
            torch.float8_e8m0fnu
        )

    return (
        packed(EXPERTS, INTER, HIDDEN // 2),
        packed(EXPERTS, INTER, HIDDEN // 2),
        packed(EXPERTS, HIDDEN, INTER // 2),
        scales(EXPERTS, INTER, HIDDEN // 32),
        scales(EXPERTS, INTER, HIDDEN // 32),
        scales(EXPERTS, HIDDEN, INTER // 32),
    )


def step_inputs(rows: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, hidden] BF16, ids: TOPK distinct uniform random experts per row, routing weights."""
    x = torch.randn(rows, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.rand(rows, EXPERTS, device="cuda", generator=gen).argsort(dim=1)[:, :TOPK].to(torch.int32)
    weights = torch.rand(rows, TOPK, device="cuda", generator=gen) + 0.1
    return x, ids, weights


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Packed MXFP4 rows [R, C/2] with UE8M0 [R, C/32] -> FP32 [R, C] on the device (low nibble first)."""
    b = packed.view(torch.uint8).long()
    codes = torch.stack((b & 15, b >> 4), dim=-1).flatten(-2)
    factors = torch.exp2(scale.view(torch.uint8).float() - 127).repeat_interleave(32, dim=1)
    return torch.tensor(E2M1, device=packed.device)[codes] * factors


def magnitude(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ws: tuple) -> torch.Tensor:
    """tests/cuda/bounds.moe_magnitude on the device: sum over a row's experts of |a_e| @ |w2_e|^T."""
    p = PARAMS
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    xin = rules_moe._gemm_input(p, x, x.dtype)
    for e in torch.unique(ids).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        w1, w3, w2 = (dequantize(ws[i][e], ws[i + 3][e]) for i in range(3))
        g, v = rules_moe._gemm(p, xin[rows], w1), rules_moe._gemm(p, xin[rows], w3)
        act = rules_moe.swiglu_f32(g, v, p.swiglu_limit) * weights[rows, slots, None]
        out.index_add_(0, rows, rowwise_linear(act.abs(), w2.abs()))
    return out


def run_variant(swap: SwapBuckets | None, args: tuple) -> torch.Tensor:
    return cuda_moe.moe_experts(PARAMS, *args, swap=swap)


def time_variant(swap: SwapBuckets | None, args: tuple) -> float:
    return graph_time_ms(lambda: cuda_moe.moe_experts(PARAMS, *args, swap=swap), repeats=10)


def sweep_rows(
    rows: int,
    ws: tuple,
    cal: dict[str, float],
    variants: Mapping[str, SwapBuckets | None],
    same_as: tuple[str, SwapBuckets | None] | None = None,
) -> list[dict[str, Any]]:
    """One case per variant (name -> swap buckets) at `rows` rows; `same_as`: (name, swap buckets) of
    the variant whose bits each result is compared with."""
    gen = torch.Generator(device="cuda").manual_seed(rows)
    x, ids, weights = step_inputs(rows, gen)
    args = (x, ids, weights, *ws)
    touched = int(torch.unique(ids).numel())
    weight_bytes = touched * expert_bytes()
    flop = 2 * ids.numel() * 3 * HIDDEN * INTER
    base = run_variant(None, args)
    bound = 2 * MOE_GPU_TOL * magnitude(x, ids, weights, ws) + 1e-6 * base.abs()
    reference = run_variant(same_as[1], args) if same_as else None
    cases = []
    for variant, swap in variants.items():
        case: dict[str, Any] = dict(
            variant=variant, rows=rows, experts_touched=touched, weight_bytes=weight_bytes
        )
        try:
            got = run_variant(swap, args)
            diff = (got - base).abs()
            if reference is not None:
                case["same_bits"] = bool(torch.equal(got, reference))
            case["max_abs_diff"] = float(diff.max())
            case["worst_diff_over_bound"] = float((diff / bound).max())
            case["ok"] = bool((diff <= bound).all())
            ms = time_variant(swap, args)
        except Exception as error:  # a variant that fails to compile or launch is reported, not fatal
            case |= dict(ok=False, error=f"{type(error).__name__}: {error}"[:300])
            cases.append(case)
            print(f"{variant:>10} rows {rows:5d}: FAILED {case['error']}", flush=True)
            continue
        case["ms"] = ms
        case["weight_gbps"] = weight_bytes / (ms * 1e-3) / 1e9
        case["fraction_of_copy"] = case["weight_gbps"] / cal["copy_gbps"]
        case["fp8_equiv_tflops"] = flop / (ms * 1e-3) / 1e12
        case["fraction_of_fp8_gemm"] = case["fp8_equiv_tflops"] / cal["fp8_gemm_tflops"]
        cases.append(case)
        flag = "" if case["ok"] else "  WRONG (diff over bound)"
        if reference is not None:
            flag += f"  same bits as {same_as[0]}: {case['same_bits']}"
        print(
            f"{variant:>10} rows {rows:5d}: {ms:8.3f} ms  {weight_bytes / 1e9:6.3f} GB  "
            f"{case['fraction_of_copy']:6.1%} of copy  {case['fp8_equiv_tflops']:7.1f} TFLOP/s "
            f"{case['fraction_of_fp8_gemm']:6.1%} of FP8  "
            f"diff/bound {case['worst_diff_over_bound']:.3g}{flag}",
            flush=True,
        )
    return cases


def main(argv: list[str] | None = None, extra: Mapping[str, SwapBuckets] | None = None) -> int:
    """`extra`: more variants (name -> swap buckets) that --variants and --same-bits-as may name."""
    table = {**CANDIDATES, **(extra or {})}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="*", default=list(CANDIDATES), choices=list(table))
    parser.add_argument("--rows", nargs="*", type=int, default=list(ROWS))
    parser.add_argument(
        "--same-bits-as",
        default=None,
        choices=list(table),
        help="a variant each result must equal bit for bit",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    cal = {"copy_gbps": copy_bandwidth_gbps(1 << 30), "fp8_gemm_tflops": fp8_gemm_tflops()}
    print(
        f"calibration: copy {cal['copy_gbps']:.0f} GB/s, FP8 GEMM {cal['fp8_gemm_tflops']:.0f} TFLOP/s",
        flush=True,
    )
    ws = random_experts(torch.Generator(device="cuda").manual_seed(0))
    variants = {name: table[name] for name in args.variants}
    same_as = (args.same_bits_as, table[args.same_bits_as]) if args.same_bits_as else None
    cases = [c for rows in args.rows for c in sweep_rows(rows, ws, cal, variants, same_as)]
    result = dict(
        **environment(),
        shape=dict(hidden=HIDDEN, inter=INTER, experts=EXPERTS, topk=TOPK, expert_bytes=expert_bytes()),
        params=vars(PARAMS),
        calibration=cal,
        default_variant=DEFAULT,
        same_bits_as=args.same_bits_as,
        cases=cases,
        seconds=time.monotonic() - start,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe_sweep.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'moe_sweep.json'} in {result['seconds']:.0f} s", flush=True)
    return 0 if all(c["ok"] and c.get("same_bits", True) for c in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
