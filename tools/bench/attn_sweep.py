"""Sparse decode attention sweep (issue 5's target: within 1.3x of FlashMLA): candidate tilings of the
cuda `attention` rule (TILINGS: the rule's TILES as "current", and others through `launch`'s `tiling`)
against FlashMLA's SM90 sparse FP8 decode at batch 1, 8, 32, 64, 128 (64 heads x 512, window 128 + top-k
512: kernels_cmp's cases and inputs).

Times are CUDA-graph replays (what a captured step sees) and eager calls (what the bench's side by side
reports: host launch work included). Each tiling is also checked on the GPU: its batch-8 output against
the cpu rule (the tests' bf16 tolerance), its decode and prefill paths for the same bits, and its bits
against the "current" tiling. Compilation comes first, one subprocess per tiling in parallel (they fill
Triton's cache; the timed process then loads the kernels from it).

    python -m dsgraph.tools.bench.attn_sweep --out DIR [--variants a,b] [--budget 85]

`--static` needs no GPU (runs here on CPU): it compiles each tiling's decode kernels for sm_90 and reads
ptxas' register/spill counts and the SASS of each key-tile loop (instructions per tile, per key and
head, spill reloads, global loads): the cost model to iterate on between GPU runs. Without a GPU the
issue-bound estimate is instructions x warps x tiles over 132 SMs x 4 schedulers x 1.98 GHz.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from dsgraph.runtime.engine_config import CacheConfig
from dsgraph.tools.bench import flashmla_ref, kernels_cmp
from dsgraph.tools.bench.flashmla_ref import SparseDecodeCase
from dsgraph.tools.bench.timing import graph_time_ms, time_ms

BATCHES = (1, 8, 32, 64, 128)
CHECK_BATCH = 8
KEY_MAX = 8.0  # |keys| of kernels_cmp's random cache bytes stay below 6 (NVFP4) and 1 (FP8 ring)


def tilings() -> dict[str, Any]:
    """name -> attention.Tiles: the rule's default ("current") and the candidates compared with it."""
    from dsgraph.platform.cuda.kernels.attention import TILES, Tiles

    # h64: each key tile decoded once for all 64 heads (wgmma); 9.6 warp instructions per key x head in
    # the sm_90 SASS against 22.5 for "current", but 64-head tilings faulted on the H200 at c68f631 (an
    # illegal memory access, before the PTX key decode), so the sweep's compile subprocess tries it first;
    # split1: a program per key tile at small batches (20 per row and head block, the tiles' load chains
    # in parallel), the decode path only up to 8 rows (its per-split state grows with the splits)
    return {
        "current": TILES, "no_key_ptx": Tiles(key_ptx=False), "h64": Tiles(block_h=64),
        "h16w4": Tiles(block_h=16, num_warps=4), "split2": Tiles(split_tiles=2),
        "split1": Tiles(split_tiles=1, decode_max_rows=8),
    }  # fmt: skip


def _case(batch: int) -> SparseDecodeCase:
    return SparseDecodeCase(batch=batch, topk=512, window=128)


def _inputs(batch: int) -> tuple[Any, tuple[torch.Tensor, ...]]:
    from dsgraph.graph.op import get_op

    case = _case(batch)
    params = get_op("attention").params_type(window=case.window, softmax_scale=case.head_dim**-0.5)
    return params, kernels_cmp._attention_inputs(case, torch.Generator(device="cuda").manual_seed(0))


def _run(name: str, params: Any, args: tuple[torch.Tensor, ...], split: bool | None = None) -> torch.Tensor:
    """The rule's launch with tiling `name`: the path the rule picks (split None) or the one asked."""
    from dsgraph.platform.cuda.kernels import attention as A

    tiling = tilings()[name]
    if split is None:
        split = args[0].shape[0] <= tiling.decode_max_rows
    return A.launch(params, *args[:4], tuple(args[4:]), split=split, tiling=tiling)


def warm(name: str) -> None:
    """Compile tiling `name` at every batch and both paths (fills Triton's cache; nothing timed)."""
    for batch in BATCHES:
        params, args = _inputs(batch)
        for split in (True, False):
            _run(name, params, args, split)
    torch.cuda.synchronize()


def _kernels() -> dict[int, str]:
    """id -> "name: registers, spilled bytes" of every attention kernel compiled in this process."""
    from dsgraph.platform.cuda.kernels import attention_tl as K

    out: dict[int, str] = {}
    try:  # Triton's private cache layout: a figure for the report, never a reason to fail
        for fn in (K.split_kernel, K.merge_kernel, K.fused_kernel):
            for cache in getattr(fn, "device_caches", {}).values():
                for kernel in cache[0].values():
                    regs, spills = getattr(kernel, "n_regs", "?"), getattr(kernel, "n_spills", "?")
                    out[id(kernel)] = f"{fn.__name__}: {regs} registers, {spills} spilled"
    except Exception as exc:
        out[0] = f"unreadable: {type(exc).__name__}"
    return out


_REFERENCE: dict[str, torch.Tensor] = {}


def check(name: str) -> dict[str, Any]:
    """Batch-8 output vs the cpu rule (bf16 tolerance of tests/cuda/test_attention.py), decode vs prefill
    bits, and bits vs the "current" tiling."""
    from dsgraph.platform.cpu.rules_attention import attention as cpu_attention

    params, args = _inputs(CHECK_BATCH)
    decode, prefill = _run(name, params, args, True), _run(name, params, args, False)
    if not _REFERENCE:
        _REFERENCE["cpu"] = cpu_attention(params, *(a.cpu() for a in args)).float()
        _REFERENCE["current"] = _run("current", params, args, True)
    want = _REFERENCE["cpu"]
    diff = (decode.cpu().float() - want).abs()
    bound = 2**-8 * KEY_MAX + 2**-7 * want.abs()
    return {
        "within_cpu_tolerance": bool((diff <= bound).all()),
        "max_abs_diff_vs_cpu": float(diff.max()),
        "decode_equals_prefill_bits": bool(torch.equal(decode, prefill)),
        "equals_current_bits": bool(torch.equal(decode, _REFERENCE["current"])),
    }


def time_variant(name: str, deadline: float) -> list[dict[str, Any]]:
    from dsgraph.platform.cpu.step_rows import unchecked

    rows = []
    for batch in BATCHES:
        if time.time() > deadline:
            rows.append({"batch": batch, "skipped": "out of time"})
            continue
        params, args = _inputs(batch)
        with unchecked():
            call = lambda p=params, a=args: _run(name, p, a)  # noqa: E731
            rows.append(
                {
                    "batch": batch,
                    "graph_ms": graph_time_ms(call, repeats=20),
                    "eager_ms": time_ms(call, repeats=20),
                }
            )
    return rows


def time_flashmla() -> list[dict[str, Any]] | str:
    why = flashmla_ref.available()
    if why is not None:
        return why
    rows = []
    for batch in BATCHES:
        row: dict[str, Any] = {"batch": batch, "eager_ms": flashmla_ref.time_flashmla(_case(batch))}
        saved = flashmla_ref.time_ms
        flashmla_ref.time_ms = lambda fn, repeats: graph_time_ms(fn, repeats=repeats)  # type: ignore[assignment]
        try:
            row["graph_ms"] = flashmla_ref.time_flashmla(_case(batch))
        except Exception as exc:  # capture may be refused: keep the eager figure
            row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            flashmla_ref.time_ms = saved
        rows.append(row)
    return rows


def _warm_all(names: list[str], jobs: int, timeout: float) -> dict[str, str]:
    def one(name: str) -> tuple[str, str]:
        cmd = [sys.executable, "-m", "dsgraph.tools.bench.attn_sweep", "--warm", name]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return name, "compile timed out"
        return name, "ok" if done.returncode == 0 else done.stderr[-600:]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(one, names))


SM90 = ("cuda", 90, 32)
STEP = ("pos_ptr", "seq_ptr", "slot_ptr", "start_ptr", "first_ptr", "table_ptr", "topk_ptr")
SIZES = ("num_rows", "num_heads", "ring_len", "num_blocks", "table_width", "topk_width")
# the pool's block size, a constexpr of the kernels: the engine's default page size
PAGE = CacheConfig().page_size


COUNTED = (
    ("spill_loads", ("LDL",)), ("spill_stores", ("STL",)), ("global_loads", ("LDG",)),
    ("mma", ("HGMMA", "HMMA")), ("shared_stores", ("STS",)), ("int_div", ("IMAD.HI",)),
)  # fmt: skip


def _sass_loops(ptx: str) -> tuple[str, list[dict[str, int]]]:
    """ptxas -v's summary and, per loop of the SASS (a backward branch), its instruction counts."""
    import collections
    import re
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "k.ptx").write_text(ptx)
        cubin = str(Path(tmp, "k.cubin"))
        cmd = [ptxas, "-v", "--gpu-name=sm_90a", str(Path(tmp, "k.ptx")), "-o", cubin]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        nvdisasm = str(Path(ptxas).with_name("nvdisasm"))
        sass = subprocess.run([nvdisasm, cubin], capture_output=True, text=True, check=True).stdout
    summary = " ".join(re.findall(r"Used \d+ registers|\d+ bytes spill stores", log))
    code, labels, pending = [], {}, []
    for line in sass.splitlines():
        if m := re.match(r"\s*(\.L_x_\d+):", line):
            pending.append(m.group(1))
        elif m := re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line):
            code.append((int(m.group(1), 16), m.group(2).split()))
            labels.update({name: code[-1][0] for name in pending})
            pending = []
    spans = []
    for at, words in code:
        target = next((w.strip("`()") for w in words if w.startswith("`(")), None)
        if "BRA" in " ".join(words) and target in labels and labels[target] < at:
            spans.append((labels[target], at))
    # Innermost loops only (the key-tile loops; the fused kernel's split loop holds them).
    inner = [(a, b) for a, b in spans if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)]
    loops = []
    for first, last in inner:
        ops = collections.Counter(
            w[1] if w[0].startswith("@") else w[0] for a, w in code if first <= a <= last
        )
        counts = {name: sum(n for op, n in ops.items() if op.startswith(keys)) for name, keys in COUNTED}
        loops.append({"instructions": sum(ops.values()), **counts})
    return summary, loops


def static(names: list[str]) -> dict[str, Any]:
    """Compile each tiling's split and fused kernels (bf16, 64 heads x 512, window 128, top-k 512) for
    sm_90 and read their SASS: no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dsgraph.platform.cuda.kernels import attention as A
    from dsgraph.platform.cuda.kernels import attention_tl as K

    inputs = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "ring_ptr": "*u8", "pool_ptr": "*u8"}
    step, sizes = {n: "*i32" for n in STEP}, {**{n: "i32" for n in SIZES}, "scale_log2": "fp32"}
    state = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"}
    kernels = {
        "split_kernel": {**inputs, **step, **state, **sizes},
        "fused_kernel": {**inputs, "sink_ptr": "*fp32", **step, "out_ptr": "*bf16", **sizes},
    }
    out: dict[str, Any] = {}
    for name in names:
        t = tilings()[name]
        splits = A.num_splits(128, 512, t.block_n, t.split_tiles)
        meta = dict(NUM_SPLITS=splits, WINDOW=128, HEAD_DIM=512, BLOCK_H=t.block_h, BLOCK_C=256,
                    BLOCK_N=t.block_n, SPLIT_TILES=t.split_tiles, HAS_POOL=True,
                    DOT=A.attention_dot(torch.bfloat16, t.key_ptx), DRAFT=0, PDL=False,
                    block_size=PAGE)  # fmt: skip
        options: dict[str, Any] = {"num_warps": t.num_warps}
        if t.num_stages is not None:
            options["num_stages"] = t.num_stages
        entry: dict[str, Any] = {}
        for kname, types in kernels.items():
            src = ASTSource(
                fn=getattr(K, kname), signature={**types, **dict.fromkeys(meta, "constexpr")}, constexprs=meta
            )
            compiled = triton.compile(src, target=GPUTarget(*SM90), options=options)
            summary, loops = _sass_loops(compiled.asm["ptx"])
            entry[kname] = {"ptxas": summary, "shared_bytes": compiled.metadata.shared, "loops": loops}
        # The split kernel's key-tile loops: SWA, then pool. Each (row, key) is visited by 2 column halves
        # x 64 heads: warp instructions per key and head, and the issue-bound time of the pool tiles of
        # 128 rows on 132 SMs x 4 schedulers at 1.98 GHz.
        pool = entry["split_kernel"]["loops"][-1] if entry["split_kernel"]["loops"] else {}
        per = pool.get("instructions", 0) * t.num_warps / (t.block_n * t.block_h)
        entry["pool_warp_instructions_per_key_head"] = per
        entry["issue_bound_ms_b128_pool"] = bound = per * 2 * 64 * 512 * 128 / (132 * 4 * 1.98e9) * 1e3
        out[name] = entry
        ptxas = entry["split_kernel"]["ptxas"], entry["fused_kernel"]["ptxas"]
        print(f"{name:<18} split: {ptxas[0]}; fused: {ptxas[1]}\n  pool tile loop {pool}\n"
              f"  {per:.1f} warp instructions per key x head; issue bound of b=128's pool: {bound:.3f} ms",
              flush=True)  # fmt: skip
    return out


def _table(result: dict[str, Any]) -> str:
    ref = result["flashmla"]
    ref_ms = {r["batch"]: r.get("graph_ms", r["eager_ms"]) for r in ref} if isinstance(ref, list) else {}
    lines = ["variant            " + "".join(f"  b={b:<4} graph ms (x FlashMLA)" for b in BATCHES)]
    if ref_ms:
        eager = {r["batch"]: r["eager_ms"] for r in ref}
        lines.append(
            "flashmla           "
            + "".join(f"  {ref_ms[b]:8.4f}          eager {eager[b]:.3f}" for b in BATCHES)
        )
    for name, v in result["variants"].items():
        cells = []
        for row in v.get("rows", []):
            if "graph_ms" not in row:
                cells.append("  skipped" + " " * 21)
                continue
            ratio = row["graph_ms"] / ref_ms[row["batch"]] if ref_ms else float("nan")
            cells.append(f"  {row['graph_ms']:8.4f} ({ratio:5.2f}x) eager {row['eager_ms']:.3f}")
        checked = v.get("check", {})
        flag = "" if checked.get("within_cpu_tolerance", False) else "  <- OUTSIDE THE CPU RULE'S TOLERANCE"
        flag += "" if checked.get("decode_equals_prefill_bits", False) else "  <- DECODE != PREFILL BITS"
        lines.append(f"{name:<19}" + "".join(cells) + flag)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--variants", default="", help="comma-separated tilings() names (default: all)")
    parser.add_argument("--budget", type=float, default=85.0, help="seconds; later cells are skipped")
    parser.add_argument("--jobs", type=int, default=12, help="tilings compiled in parallel")
    parser.add_argument("--warm", default="", help=argparse.SUPPRESS)
    parser.add_argument("--static", action="store_true", help="SASS cost per tiling, no GPU (see above)")
    opts = parser.parse_args(argv)
    import dsgraph.ops  # noqa: F401  (declares the ops)

    if opts.warm:
        warm(opts.warm)
        return 0
    start = time.time()
    names = [n for n in opts.variants.split(",") if n] or list(tilings())
    unknown = sorted(set(names) - set(tilings()))
    if unknown:
        parser.error(f"--variants: {unknown}, expected names of {sorted(tilings())}")
    if opts.static:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "attn_static.json").write_text(json.dumps(static(names), indent=1))
        return 0
    names = ["current", *(n for n in names if n != "current")]
    compiled = _warm_all(names, opts.jobs, timeout=opts.budget * 0.6)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.UTC).isoformat(),
        "case": "64 heads x 512, window 128 + top-k 512, bf16 queries", "compile_s": time.time() - start,
        "flashmla": time_flashmla(), "variants": {},
    }  # fmt: skip
    deadline = start + opts.budget
    for name in names:
        entry: dict[str, Any] = {"tiles": asdict(tilings()[name]), "compile": compiled[name]}
        before = _kernels()
        if compiled[name] == "ok":
            try:
                entry["check"] = check(name)
                entry["rows"] = time_variant(name, deadline)
            except Exception as exc:  # one broken tiling must not end the sweep
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        entry["kernels"] = sorted(set(v for k, v in _kernels().items() if k not in before))
        result["variants"][name] = entry
    result["total_s"] = time.time() - start
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "attn_sweep.json").write_text(json.dumps(result, indent=1))
    print(_table(result))
    print(
        json.dumps(
            {k: v.get("check", v.get("error", v["compile"])) for k, v in result["variants"].items()}, indent=1
        )
    )
    print(f"total {result['total_s']:.1f} s; JSON: {opts.out / 'attn_sweep.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
