"""Shared helpers of the cuda platform tests: the device, per-dtype tolerances, and running one op's
cuda rule and cpu rule on the same inputs.

The device is "cuda" when present, else "cpu" (kernels then run under Triton's interpreter, switched on
by tests/cuda/conftest.py). The cpu rule always runs on CPU copies of the inputs: it is the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

# (rtol, atol) of a kernel result against the cpu rule, by the result's dtype. Float results differ by
# accumulation order only (f32 accumulators), so the bound is a few units in the last place of the
# output dtype; integer, bool and byte results (indices, masks, encoded caches) must be equal.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (2 * 2.0**-8, 1e-5),
    torch.float16: (2 * 2.0**-11, 1e-6),
    torch.float8_e4m3fn: (2.0**-3, 2.0**-9),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for results of `dtype`; (0, 0) for exact dtypes."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def on_device(args: Sequence[Any], device: torch.device | str = DEVICE) -> list[Any]:
    """Copies of the tensor arguments on `device` (other values as they are)."""
    return [a.detach().clone().to(device) if isinstance(a, torch.Tensor) else a for a in args]


def as_tuple(result: Any) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def assert_matches(
    got: torch.Tensor, want: torch.Tensor, what: str, tol: tuple[float, float] | None = None
) -> None:
    """`got` (any device) equals `want` within the tolerance of want's dtype; names `what` on failure."""
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        raise AssertionError(
            f"{what}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        )
    rtol, atol = tol if tol is not None else tolerance(want.dtype)
    got, want = got.cpu(), want.cpu()
    if want.dtype in TOLERANCES:
        torch.testing.assert_close(
            got.float(), want.float(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}"
        )
    elif not torch.equal(got, want):
        bad = (got != want).nonzero()[0].tolist()
        raise AssertionError(f"{what}: differs at {bad}: {got[tuple(bad)]} != {want[tuple(bad)]}")


def compare_rules(
    op: str,
    params: Any,
    args: Sequence[Any],
    *,
    cuda_rule: Any = None,
    tol: tuple[float, float] | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Run `op`'s kernel rule (its kernel module's `RULES`, or `cuda_rule`) on DEVICE copies of `args` and
    its cpu rule on CPU copies; assert every result matches; returns (cuda results, cpu results). An op
    without a kernel rule fails: the cuda platform would run the cpu rule there, and a cpu rule compared
    with itself proves nothing."""
    from dsgraph.platform.cpu.target import PLATFORM as CPU

    rule = cuda_rule if cuda_rule is not None else kernel_rule(op)
    got = as_tuple(rule(params, *on_device(args)))
    want = as_tuple(CPU.rules[op](params, *on_device(args, "cpu")))
    if len(got) != len(want):
        raise AssertionError(f"{op}: the cuda rule returned {len(got)} results, the cpu rule {len(want)}")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.device.type != DEVICE.type:
            raise AssertionError(f"{op}: result {i} is on {g.device}, expected {DEVICE}")
        assert_matches(g, w, f"{op} result {i}", tol)
    return got, want


def kernel_rule(op: str) -> Any:
    """The kernel rule of `op`; an AssertionError naming the import errors when there is none."""
    from dsgraph.platform.cuda import target

    if op not in target.KERNEL_RULES:
        errors = "; ".join(f"kernels.{m}: {e}" for m, e in target.IMPORT_ERRORS.items()) or "none"
        raise AssertionError(f"{op}: no kernel rule to test (kernel module import errors: {errors})")
    return target.KERNEL_RULES[op]
