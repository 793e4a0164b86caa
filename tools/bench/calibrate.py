"""Ceilings measured in the same run as every benchmark figure: device copy bandwidth and dense
FP8/BF16 GEMM rates (`torch._scaled_mm`, per-tensor scales; `torch.matmul` in bf16)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from dsgraph.tools.bench.timing import time_ms


@dataclass(frozen=True)
class Calibration:
    copy_gbps: float  # device-to-device copy, bytes read + written per second / 1e9
    fp8_gemm_tflops: float  # _scaled_mm m=n=k=gemm_size
    bf16_gemm_tflops: float
    gemm_size: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def copy_bandwidth_gbps(nbytes: int = 4 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), repeats=10)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def fp8_gemm_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    ms = time_ms(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16), repeats=10)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def bf16_gemm_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b, repeats=10)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def calibrate(gemm_size: int = 8192) -> Calibration:
    return Calibration(
        copy_gbps=copy_bandwidth_gbps(),
        fp8_gemm_tflops=fp8_gemm_tflops(gemm_size),
        bf16_gemm_tflops=bf16_gemm_tflops(gemm_size),
        gemm_size=gemm_size,
    )
