"""Reference meaning of act_qdq, cache_encode, cache_decode and grouped_linear, in torch.

The codecs themselves live in platform/cpu/quant.py and cache_format.py; these rules only pick the
codec a `fmt` names, so `decode(encode(x)) == act_qdq(x)` holds by construction of those codecs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dsgraph.ops.quant import SAME_DTYPE
from dsgraph.platform.cpu import cache_format as CF
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.quant import fp8_g32_qdq, mxfp4_g32_qdq, nvfp4_g16_qdq
from dsgraph.platform.cpu.rules_core import linear_operands
from dsgraph.platform.cpu.step_rows import rowwise_linear

_QDQ: dict[str, Callable[[Tensor], Tensor]] = {
    "fp8_g32": fp8_g32_qdq,
    "mxfp4_g32": mxfp4_g32_qdq,
    "nvfp4_g16": lambda x: nvfp4_g16_qdq(x, "divide"),
    "nvfp4_g16_recip": lambda x: nvfp4_g16_qdq(x, "reciprocal"),
    "f32": lambda x: x,
}
_ENCODE: dict[str, Callable[[Tensor], Tensor]] = {
    "fp8_g32": CF.fp8_g32_encode,
    "mxfp4_g32": CF.mxfp4_g32_encode,
    "nvfp4_g16": lambda x: CF.nvfp4_g16_encode(x, "divide"),
    "nvfp4_g16_recip": lambda x: CF.nvfp4_g16_encode(x, "reciprocal"),
    "f32": CF.f32_encode,
}
# Both NVFP4 value rules store the same byte layout; only encoding differs.
_DECODE: dict[str, Callable[[Tensor, torch.dtype], Tensor]] = {
    "fp8_g32": CF.fp8_g32_decode,
    "mxfp4_g32": CF.mxfp4_g32_decode,
    "nvfp4_g16": CF.nvfp4_g16_decode,
    "nvfp4_g16_recip": CF.nvfp4_g16_decode,
    "f32": CF.f32_decode,
}


def decode_entries(fmt: str, entries: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The values of cache entries in format `fmt` (what `cache_decode` computes)."""
    return _DECODE[fmt](entries, dtype)


def qdq_dtype(p: Any, x: Tensor) -> torch.dtype:
    """The dtype act_qdq stores its values in: out_dtype, or x's dtype for `same`."""
    return x.dtype if p.out_dtype == SAME_DTYPE else to_torch(p.out_dtype)


def act_qdq(p: Any, x: Tensor) -> Tensor:
    # The codec computes in f32 and casts once to the output dtype.
    return _QDQ[p.fmt](x.float()).to(qdq_dtype(p, x))


def cache_encode(p: Any, x: Tensor) -> Tensor:
    return _ENCODE[p.fmt](x.float())


def cache_decode(p: Any, entries: Tensor) -> Tensor:
    return _DECODE[p.fmt](entries, to_torch(p.dtype))


def grouped_linear(p: Any, x: Tensor, w: Tensor, *scale: Tensor) -> Tensor:
    xf, wf = linear_operands(p, x, w, *scale)
    groups = x.shape[-2]
    per_group = wf.reshape(groups, wf.shape[0] // groups, wf.shape[1])  # [G, n, k]: rows g*n .. (g+1)*n - 1
    out = torch.stack([rowwise_linear(xf[..., g, :], per_group[g]) for g in range(groups)], dim=-2)
    return out.to(to_torch(p.out_dtype))


RULES: dict[str, Any] = {
    "act_qdq": act_qdq,
    "cache_encode": cache_encode,
    "cache_decode": cache_decode,
    "grouped_linear": grouped_linear,
}
