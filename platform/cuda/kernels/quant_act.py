"""cuda rules of `act_qdq` and `cache_encode` (dsgraph.ops.quant): one Triton kernel each (quant_act_tl.py)
for every format (fp8_g32, mxfp4_g32, nvfp4_g16, nvfp4_g16_recip), bit-equal to the cpu codecs
(platform/cpu/quant.py, cache_format.py). Each group is quantized on its own, so results are batch
invariant. Falls back to the cpu rule for CPU tensors without Triton's interpreter, for a width that is
not a positive multiple of the group (the cpu codec raises the error) and for empty tensors.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from dsgraph.ops.quant import GROUP_SIZES, SAME_DTYPE, entry_bytes
from dsgraph.platform.cpu import rules_fused, rules_quant
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels.attention import runs_kernels
from dsgraph.platform.cuda.kernels.mhc import triton_cdiv, triton_dtype

__all__ = ["RULES", "act_qdq", "cache_encode", "epilogue", "then_qdq"]

FORMATS = {"fp8_g32": 0, "mxfp4_g32": 1, "nvfp4_g16": 2, "nvfp4_g16_recip": 3}
BLOCK_G = 16  # groups per program
NUM_WARPS = 4


def _kernel_shape(p: Any, x: Tensor) -> tuple[int, int, int] | None:
    """(rows, width, group) when the kernel applies, else None (the cpu rule runs)."""
    if not runs_kernels(x) or p.fmt not in FORMATS or x.dim() == 0 or x.numel() == 0:
        return None
    width, group = x.shape[-1], GROUP_SIZES[p.fmt]
    if width % group:
        return None
    return x.numel() // width, width, group


def act_qdq(p: Any, x: Tensor) -> Tensor:
    shape = _kernel_shape(p, x)
    if shape is None:
        return rules_quant.act_qdq(p, x)
    from dsgraph.platform.cuda.kernels import quant_act_tl as K

    rows, width, group = shape
    out = torch.empty(x.shape, dtype=rules_quant.qdq_dtype(p, x), device=x.device)
    K.qdq_kernel[(rows, triton_cdiv(width // group, BLOCK_G))](
        x.contiguous(), out, D=width, FMT=FORMATS[p.fmt], GROUP=group, BLOCK_G=BLOCK_G,
        OUT=triton_dtype(out.dtype), num_warps=NUM_WARPS, enable_fp_fusion=False, **pdl.launch(),
    )  # fmt: skip
    return out


def cache_encode(p: Any, x: Tensor) -> Tensor:
    shape = _kernel_shape(p, x)
    if shape is None:
        return rules_quant.cache_encode(p, x)
    from dsgraph.platform.cuda.kernels import quant_act_tl as K

    rows, width, group = shape
    size = entry_bytes(p.fmt, width)
    out = torch.empty((*x.shape[:-1], size), dtype=torch.uint8, device=x.device)
    K.encode_kernel[(rows, triton_cdiv(width // group, BLOCK_G))](
        x.contiguous(), out, D=width, ENTRY=size, FMT=FORMATS[p.fmt], GROUP=group, BLOCK_G=BLOCK_G,
        num_warps=NUM_WARPS, enable_fp_fusion=False, **pdl.launch(),
    )  # fmt: skip
    return out


def epilogue(
    p: Any, shape: tuple[int, ...], y_dtype: torch.dtype, device: torch.device, *widths: int
) -> tuple[Tensor, dict[str, Any]] | None:
    """A `<op>_qdq` op's quantization (ops/fused.py) in its op's kernel, for an op whose result has this
    shape and y_dtype: (an empty tensor for q on `device`, the kernel's QDQ / GROUP / QOUT arguments),
    or None where the kernel does not apply (a format without one, one of `widths`, the column runs the
    kernel quantizes apart, not a multiple of the group, or no elements): the rule then runs the op and
    `then_qdq`."""
    from dsgraph.ops.fused import qdq_params

    q = qdq_params(p)
    if q.fmt not in FORMATS or any(w % GROUP_SIZES[q.fmt] for w in widths) or not math.prod(shape):
        return None
    dtype = y_dtype if q.out_dtype == SAME_DTYPE else to_torch(q.out_dtype)
    out = torch.empty(shape, dtype=dtype, device=device)
    return out, dict(QDQ=FORMATS[q.fmt], GROUP=GROUP_SIZES[q.fmt], QOUT=triton_dtype(dtype))


def no_epilogue(y: Tensor) -> dict[str, Any]:
    """The QDQ arguments of a producer's kernel run as the plain op."""
    return dict(QDQ=-1, GROUP=32, QOUT=triton_dtype(y.dtype))


def then_qdq(p: Any, y: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    """A fused op's outputs from its producer's result y by a launch of its own (act_qdq's rule)."""
    return rules_fused.then_qdq(p, y, act_qdq)


RULES: dict[str, Any] = {"act_qdq": act_qdq, "cache_encode": cache_encode}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them)
KERNELS: dict[str, tuple[str, ...]] = {
    "act_qdq": ("quant_act_tl.qdq_kernel",),
    "cache_encode": ("quant_act_tl.encode_kernel",),
}
