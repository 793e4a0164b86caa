"""Programmatic dependent launch on a synthetic chain, apart from the model: 8 "layers" of five FP8 GEMVs
(the decode shapes 5120->1280->4096->5120->2304->5120, two of them split in K with atomic adds) each
followed by a small element-wise kernel, 112 launches captured in one CUDA graph, timed plainly, with PDL,
with PDL and a register prefetch of each program's first weight tile, with PDL and an L2 bulk prefetch
of its whole rows, and with that prefetch alone. Prints and saves JSON with each chain's time and its
weight bytes over the time against the copy bandwidth measured in the same run. (The split GEMVs add
with atomics, so the chains' last bits differ from run to run: this compares times only.) The run in
bench/results/pdl-chain-H100-40764c0.json timed each chain inline (the fastest of 5 rounds of 50 replays,
plus a repeat of "off" and its last outputs' differences); it now uses the bench's calibration and graph
timing. The model's
own step with and without PDL is tools/bench/pdl_ab.py.

    python -m dsgraph.tools.bench.pdl_chain bench/results/pdl-chain.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsgraph.platform.cuda.kernels.pdl_tl import prefetch_l2


@triton.jit
def gemv(
    x_ptr,
    w_ptr,
    out_ptr,
    N,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    SPLITS: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    KS: tl.constexpr = K // SPLITS
    base = split * KS
    acc = tl.zeros((BLOCK_N,), tl.float32)
    if PDL:
        gdc_launch_dependents()
    if PREFETCH == 2:
        prefetch_l2(w_ptr + n.to(tl.int64) * K + base, tl.full((BLOCK_N,), KS, tl.int32))
    if PREFETCH == 1:
        w0 = tl.load(w_ptr + n[:, None] * K + (base + k)[None, :]).to(tl.float32)
    if PDL:
        gdc_wait()
    if PREFETCH == 1:
        acc += tl.sum(w0 * tl.load(x_ptr + base + k).to(tl.float32)[None, :], axis=1)
        start = BLOCK_K
    else:
        start = 0
    for k0 in range(start, KS, BLOCK_K):
        w = tl.load(w_ptr + n[:, None] * K + (base + k0 + k)[None, :]).to(tl.float32)
        acc += tl.sum(w * tl.load(x_ptr + base + k0 + k).to(tl.float32)[None, :], axis=1)
    if SPLITS == 1:
        tl.store(out_ptr + n, acc.to(tl.bfloat16))
    else:
        tl.atomic_add(out_ptr + n, acc)


@triton.jit
def ew(src_ptr, dst_ptr, n_size, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_size
    v = tl.load(src_ptr + i, mask=m, other=0.0).to(tl.float32)
    tl.store(dst_ptr + i, (v * 0.5 + 1.0).to(dst_ptr.dtype.element_ty), mask=m)


def build(shapes, layers, dev):
    ws = [
        [torch.randn(n, k, device=dev).to(torch.float8_e4m3fn) for n, k, _ in shapes] for _ in range(layers)
    ]
    return ws


def chain(ws, shapes, x, bufs, pdl, prefetch):
    h = x
    for lw in ws:
        for (n, k, splits), w, (o32, obf) in zip(shapes, lw, bufs, strict=True):
            if splits == 1:
                gemv[(n // 64, 1)](
                    h,
                    w,
                    obf,
                    n,
                    K=k,
                    BLOCK_N=64,
                    BLOCK_K=256,
                    PDL=pdl,
                    PREFETCH=prefetch,
                    SPLITS=1,
                    num_warps=4,
                    launch_pdl=pdl,
                )
                src = obf
            else:
                ew[(triton.cdiv(n, 1024),)](
                    o32, o32, 0, BLOCK=1024, PDL=pdl, num_warps=4, launch_pdl=pdl
                )  # stand-in for the zeroing launch
                o32.zero_()
                gemv[(n // 64, splits)](
                    h,
                    w,
                    o32,
                    n,
                    K=k,
                    BLOCK_N=64,
                    BLOCK_K=256,
                    PDL=pdl,
                    PREFETCH=prefetch,
                    SPLITS=splits,
                    num_warps=4,
                    launch_pdl=pdl,
                )
                src = o32
            ew[(triton.cdiv(n, 1024),)](src, obf, n, BLOCK=1024, PDL=pdl, num_warps=4, launch_pdl=pdl)
            h = obf
    return h


def main() -> None:
    from dsgraph.tools.bench.calibrate import copy_bandwidth_gbps
    from dsgraph.tools.bench.timing import graph_time_ms

    dev = "cuda"
    # (N, K, splits) of each FP8 GEMV, whose input width is the previous one's output width:
    # 5120 -> 1280 -> 4096 -> 5120 -> 2304 -> 5120, each followed by a small element-wise launch
    cyc = [(1280, 5120, 1), (4096, 1280, 1), (5120, 4096, 4), (2304, 5120, 4), (5120, 2304, 1)]
    layers = 8
    ws = build(cyc, layers, dev)
    bufs = [(torch.zeros(n, device=dev), torch.zeros(n, device=dev, dtype=torch.bfloat16)) for n, _, _ in cyc]
    x = torch.randn(5120, device=dev, dtype=torch.bfloat16)
    nbytes = sum(n * k for n, k, _ in cyc) * layers
    copy_gbps = copy_bandwidth_gbps()
    res = {
        "gpu": torch.cuda.get_device_name(),
        "copy_gbps": copy_gbps,
        "weight_bytes": nbytes,
        "kernels": layers * (len(cyc) * 2 + 2 * sum(1 for c in cyc if c[2] > 1)),
    }
    for name, pdl, pre in (
        ("off", False, 0),
        ("pdl", True, 0),
        ("pdl_prefetch", True, 1),
        ("pdl_l2", True, 2),
        ("off_l2", False, 2),
    ):
        try:
            ms = graph_time_ms(lambda pdl=pdl, pre=pre: chain(ws, cyc, x, bufs, pdl, pre), repeats=50)
            res[name] = {"ms": ms, "fraction_of_copy": nbytes / (ms / 1e3) / (copy_gbps * 1e9)}
        except Exception as e:  # noqa: BLE001  (one setting failing must not cost the others)
            res[name] = {"error": repr(e)[:400]}
    print(json.dumps(res, indent=1))
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
