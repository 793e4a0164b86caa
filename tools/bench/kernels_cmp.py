"""Kernel side-by-sides in the bench's run: our sparse decode attention (the cuda platform's `attention`
rule) against FlashMLA's SM90 sparse FP8 decode at the same queries, heads, top-k and window; our FP8
block-scaled linear against `torch._scaled_mm` (per-tensor scales: the dense FP8 ceiling) at the
model's shapes. Inputs follow the ops' operand contracts (ops/attention.py, ops/nn.py)."""

from __future__ import annotations

from typing import Any

import torch

from dsgraph.graph.op import get_op
from dsgraph.platform.cpu.cache_format import fp8_g32_entry_bytes, nvfp4_g16_entry_bytes
from dsgraph.platform.cpu.step_rows import unchecked
from dsgraph.platform.registry import get_platform
from dsgraph.tools.bench import flashmla_ref
from dsgraph.tools.bench.calibrate import Calibration
from dsgraph.tools.bench.flashmla_ref import SparseDecodeCase
from dsgraph.tools.bench.timing import time_ms

PAGE, RING = 64, 134


def _rule_name(op: str) -> tuple[Any, str]:
    rule = get_platform("cuda").rules[op]
    return rule, f"{getattr(rule, '__module__', '?')}.{getattr(rule, '__qualname__', '?')}"


def _attention_inputs(case: SparseDecodeCase, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    b, d = case.batch, case.head_dim
    dev = "cuda"
    q = torch.randn(b, case.heads, d, generator=gen, device=dev).bfloat16()
    kv = torch.randn(b, d, generator=gen, device=dev).bfloat16()
    ring = torch.randint(0x30, 0x40, (b, RING, fp8_g32_entry_bytes(d)), generator=gen, device=dev).byte()
    pages = -(-case.context // PAGE)
    pool = torch.randint(0x30, 0x40, (b * pages, PAGE, nvfp4_g16_entry_bytes(d)), generator=gen, device=dev)
    table = torch.arange(b * pages, device=dev, dtype=torch.int32).view(b, pages)
    topk = torch.rand(b, case.context, generator=gen, device=dev).topk(case.topk, dim=1).indices
    seqs = torch.arange(b, device=dev, dtype=torch.int32)
    pos = torch.full((b,), case.context * 2 - 1, device=dev, dtype=torch.int32)
    zero = torch.zeros(b, device=dev, dtype=torch.int32)
    sink = torch.zeros(case.heads, device=dev)
    return (q, kv, ring, sink, pos, seqs, seqs, pos, zero, pool.byte(), table, topk.sort(1).values.int())


def ours_sparse_decode_ms(case: SparseDecodeCase) -> tuple[float, str]:
    rule, name = _rule_name("attention")
    params = get_op("attention").params_type(window=case.window, softmax_scale=case.head_dim**-0.5)
    args = _attention_inputs(case, torch.Generator(device="cuda").manual_seed(0))
    with unchecked():  # the captured step runs without the eager operand checks (host reads)
        return time_ms(lambda: rule(params, *args), repeats=20), name


def attention_cases(cal: Calibration) -> list[dict[str, Any]]:
    why = flashmla_ref.available()
    rows = []
    for batch in (1, 8, 32, 64, 128):
        case = SparseDecodeCase(batch=batch, topk=512, window=128)
        row: dict[str, Any] = {"batch": batch, "topk": case.topk, "window": case.window}
        ours, row["ours_rule"] = ours_sparse_decode_ms(case)
        ours_bytes = flashmla_ref.bytes_read(case, nvfp4_g16_entry_bytes(512), fp8_g32_entry_bytes(512))
        row.update(ours_ms=ours, ours_fraction_of_copy=ours_bytes / (ours * 1e-3) / 1e9 / cal.copy_gbps)
        if why is None:
            ref = flashmla_ref.time_flashmla(case)
            v40 = flashmla_ref.bytes_read(case, flashmla_ref.V40_ENTRY_BYTES, flashmla_ref.V40_ENTRY_BYTES)
            row.update(flashmla_ms=ref, ours_over_flashmla=ours / ref)
            row["flashmla_fraction_of_copy"] = v40 / (ref * 1e-3) / 1e9 / cal.copy_gbps
        else:
            row["flashmla"] = why
        rows.append(row)
    return rows


def _linear_row(m: int, n: int, k: int, cal: Calibration) -> dict[str, Any]:
    rule, name = _rule_name("linear")
    params = get_op("linear").params_type(weight_format="fp8_block32", act_quant="fp8_g32", out_dtype="bf16")
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.float8_e4m3fn)
    scale = torch.ones(n // 32, k // 32, device="cuda").to(torch.float8_e8m0fnu)
    with unchecked():
        ours = time_ms(lambda: rule(params, x, w, scale), repeats=10)
    x8, one = x.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
    ref = time_ms(lambda: torch._scaled_mm(x8, w.t(), one, one, out_dtype=torch.bfloat16), repeats=10)
    tflops = 2 * m * n * k / (ours * 1e-3) / 1e12
    return {
        "m": m, "n": n, "k": k, "ours_ms": ours, "scaled_mm_ms": ref, "ours_over_scaled_mm": ours / ref,
        "ours_tflops": tflops, "fraction_of_fp8_gemm": tflops / cal.fp8_gemm_tflops, "ours_rule": name,
    }  # fmt: skip


def linear_cases(cal: Calibration) -> list[dict[str, Any]]:
    shapes = ((64, 32768, 1280), (4096, 32768, 1280), (16384, 5120, 8192), (4096, 2304, 5120))
    return [_linear_row(m, n, k, cal) for m, n, k in shapes]


def kernel_cases(cal: Calibration) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fn in (("sparse_decode_attention", attention_cases), ("fp8_linear", linear_cases)):
        try:
            out[name] = fn(cal)
        except Exception as exc:  # a missing kernel must not end the bench
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out
