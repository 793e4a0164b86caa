"""GPU sweep of candidate swap-AB tile sets for `moe_experts` (moe.SwapTiles) at V4.1's widths:
`python -m dsgraph.tools.bench.moe_tiles --out DIR [--set decode|prefill|dequant|asm|prefill_*]` makes each
candidate a one-bucket variant (`candidates`), prints for a few row counts whether its output has the
same bits as "swap"'s (a variant that mixes tile sets across its row buckets keeps rows batch invariant
only then), and times the candidates with moe_sweep (DIR/moe_sweep.json). The decode set gave the
default's decode tiles (moe.SWAP_BUCKETS; bench/results/moe-sweep-*-ds-decode-tiles*.json), the prefill
set its prefill choice.
The asm set times the inline-PTX E2M1 upcast at decode tiles against the default, bit for bit.
The dequant set times the kernel's own word-wise dequantization (SwapTiles.scaled False) at decode tiles
against the default swap_ds, each candidate with the default's prefill bucket, at 1 to 4096 rows, and
checks every result bit for bit against `scaled_ref`: dot_scaled (Triton's upcast, a separate
implementation of the same BF16 values) at every bucket, the numerics of the kernels before the
word-wise dequantization.
The prefill_asm set times the inline-PTX upcast (and the kernel's own dequantization at 128 sorted rows)
at prefill tiles behind the default's decode bucket, at --rows (4,096 and 16,384), bit for bit against
the default; the prefill_tokens set does the same for tiles with the sorted rows on the dot's M side
(SwapTiles.tokens: one upcast of a weight tile serves 128-256 rows).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dsgraph.platform.cuda.kernels.moe import SWAP_BUCKETS, SwapBuckets, SwapTiles
from dsgraph.tools.bench import moe_sweep

T = SwapTiles
_BIG = 1 << 62
DECODE = {  # (weight rows, sorted rows, columns, warps, stages, dot_scaled) for both GEMMs
    f"d_{'ds' if t.scaled else 'dq'}_{t.block_w}_{t.block_k}_w{t.num_warps}s{t.num_stages}": t
    for t in (
        T(64, 16, 64, 4, 4, True),
        T(64, 16, 128, 4, 4, True),
        T(64, 16, 128, 4, 2, True),
        T(32, 16, 128, 4, 4, True),
        T(64, 16, 256, 4, 3, True),
        T(128, 16, 64, 4, 4, True),
        T(64, 16, 64, 2, 4, True),
        T(64, 16, 64, 1, 4, True),
        T(128, 16, 64, 2, 4, True),
        T(32, 16, 64, 1, 4, True),
        T(64, 16, 64, 2, 2, True),
        T(64, 16, 64, 2, 6, True),
    )
}
DEQUANT = {  # decode tiles (both GEMMs) without dot_scaled: the word-wise dequantization
    f"d_dq_{t.block_w}_{t.block_k}_w{t.num_warps}s{t.num_stages}": t
    for t in (
        T(64, 16, 64, 2, 4),  # swap_ds's decode tiles
        T(64, 16, 64, 4, 2),  # one warpgroup (wgmma, weights from registers); "swap" has stages 4
        T(128, 16, 64, 8, 3),
        T(128, 16, 64, 4, 4),
        T(32, 16, 64, 1, 4),
    )
}
ASM = {  # decode tiles (both GEMMs) with the inline-PTX E2M1 upcast (moe_swap_tl._dequantize_asm), and
    # dot_scaled's at the same tiles (the same bits through Triton's upcast: a same-run reference)
    f"{'asm' if t.asm else 'ds'}_{t.block_w}_w{t.num_warps}s{t.num_stages}": t
    for t in (
        T(64, 16, 64, 2, 3, asm=True),
        T(64, 16, 64, 2, 4, asm=True),
        T(64, 16, 64, 2, 3, scaled=True),
    )  # the 4-warp tiles (wgmma) are right but not the bits of these and slower
}
PREFILL = {  # (gated tiles, down tiles)
    "p_ds_128x128_k64": (T(128, 64, 64, 8, 3, True), T(128, 128, 64, 8, 3, True)),
    "p_ds_128x64_k64_s4": (T(128, 64, 64, 8, 4, True), T(128, 64, 64, 8, 4, True)),
    "p_ds_64x128_k64": (T(64, 128, 64, 4, 3, True), T(64, 128, 64, 4, 3, True)),
    "p_ds_128x128_k128": (T(128, 128, 128, 8, 3, True), T(128, 128, 128, 8, 3, True)),
}


PREFILL_ASM = {  # (gated tiles, down tiles): the inline-PTX upcast at prefill tiles (pipelined weight loads)
    "pa_128x64_s3": (T(128, 64, 64, 8, 3, asm=True), T(128, 128, 64, 8, 3, asm=True)),
    "pa_128x64_s4": (T(128, 64, 64, 8, 4, asm=True), T(128, 64, 64, 8, 4, asm=True)),
    "pa_64x64_w4": (T(64, 64, 64, 4, 3, asm=True), T(64, 128, 64, 4, 3, asm=True)),
    "pa_64x128_w4": (T(64, 128, 64, 4, 3, asm=True), T(64, 128, 64, 4, 3, asm=True)),
    "pa_128x128_s3": (T(128, 128, 64, 8, 3, asm=True), T(128, 128, 64, 8, 3, asm=True)),
    "pa_256x64_w8": (T(256, 64, 64, 8, 3, asm=True), T(256, 64, 64, 8, 3, asm=True)),
    "pd_128x128_s3": (T(128, 128, 64, 8, 3), T(128, 128, 64, 8, 3)),  # the kernel's own dequantization
}


_DOWN_T128 = T(128, 128, 64, 8, 3, tokens=True)  # w2 with 128 pairs per tile on the dot's M side
PREFILL_TOKENS = {  # (gated tiles, down tiles): the sorted rows on the dot's M side (SwapTiles.tokens)
    "pt_down_128x128": (SWAP_BUCKETS[-1][1], _DOWN_T128),
    "pt_down_128x256": (SWAP_BUCKETS[-1][1], T(128, 256, 64, 8, 3, tokens=True)),
    "pt_both_64x64": (T(64, 64, 64, 4, 3, tokens=True), _DOWN_T128),
    # spills about 1.4 KB of registers on sm_90 (the gated epilogue's two accumulators): timed anyway
    "pt_both_128x128": (T(128, 128, 64, 8, 3, tokens=True), _DOWN_T128),
}
PREFILL_SETS = {"prefill_asm": PREFILL_ASM, "prefill_tokens": PREFILL_TOKENS}


def candidates(which: str) -> dict[str, SwapBuckets]:
    """The set's candidates as variants (name -> swap buckets): one bucket each, or for the dequant set
    the candidate's decode tiles up to 512 rows then the default's prefill bucket, and `scaled_ref`."""
    if which == "dequant":
        prefill = SWAP_BUCKETS[-1]
        table: dict[str, SwapBuckets] = {name: ((512, t, t), prefill) for name, t in DEQUANT.items()}
        scaled_prefill = T(128, 64, 64, 8, 4, True)  # p_ds_128x64_k64_s4 (bench/results, prefill tiles)
        table["scaled_ref"] = (SWAP_BUCKETS[0], (_BIG, scaled_prefill, scaled_prefill))
        return table
    if which == "asm":  # decode tiles up to 512 rows, the default's prefill bucket above
        return {name: ((512, t, t), SWAP_BUCKETS[-1]) for name, t in ASM.items()}
    if which in PREFILL_SETS:  # the default's decode bucket, the candidate's tiles above it
        return {name: (SWAP_BUCKETS[0], (_BIG, g, d)) for name, (g, d) in PREFILL_SETS[which].items()}
    cases = {name: (t, t) for name, t in DECODE.items()} if which == "decode" else PREFILL
    return {name: ((_BIG, gated, down),) for name, (gated, down) in cases.items()}


def same_bits(table: dict[str, SwapBuckets], rows_list: tuple[int, ...], reference: str = "swap") -> None:
    ws = moe_sweep.random_experts(torch.Generator(device="cuda").manual_seed(0))
    for rows in rows_list:
        x, ids, weights = moe_sweep.step_inputs(rows, torch.Generator(device="cuda").manual_seed(rows))
        ref = moe_sweep.run_variant(moe_sweep.CANDIDATES[reference], (x, ids, weights, *ws))
        for name, swap in table.items():
            got = moe_sweep.run_variant(swap, (x, ids, weights, *ws))
            print(f"{name} rows {rows}: same bits as {reference}: {torch.equal(ref, got)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--set", choices=("decode", "prefill", "dequant", "asm", *PREFILL_SETS), default="decode"
    )
    parser.add_argument("--rows", nargs="*", default=["4096", "16384"], help="prefill_*: step rows")
    args = parser.parse_args(argv)
    table = candidates(args.set)
    if args.set == "dequant":
        rows = ["1", "8", "64", "256", "4096"]
        names = ["swap_ds", "swap", *DEQUANT]
        sweep = ["--out", str(args.out), "--rows", *rows, "--variants", *names]
        return moe_sweep.main([*sweep, "--same-bits-as", "scaled_ref"], extra=table)
    if args.set == "asm":  # a candidate replaces the default's decode tiles only with its bits
        sweep = ["--out", str(args.out), "--rows", "1", "8", "64", "256", "--variants", "swap_ds", *ASM]
        return moe_sweep.main([*sweep, "--same-bits-as", "swap_ds"], extra=table)
    if args.set in PREFILL_SETS:  # a candidate replaces the default's prefill tiles only with its bits
        names = list(PREFILL_SETS[args.set])
        sweep = ["--out", str(args.out), "--rows", *args.rows, "--variants", "swap_ds", *names]
        return moe_sweep.main([*sweep, "--same-bits-as", "swap_ds"], extra=table)
    same_bits(table, (1, 64, 600, 4096))
    rows = ["1", "8", "64", "256"] if args.set == "decode" else ["4096"]
    names = ["swap", "swap_ds", *table]
    return moe_sweep.main(["--out", str(args.out), "--rows", *rows, "--variants", *names], extra=table)


if __name__ == "__main__":
    raise SystemExit(main())
