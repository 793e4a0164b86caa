"""cuda rules of `rms_norm` and `rope` (dsgraph.ops.nn, dsgraph.ops.rope): one Triton kernel each
(norm_rope_tl.py) in place of the cpu rules' chains of small torch kernels. The fused ops (ops/fused.py)
run the same kernels: `rms_norm_qdq` and `rope_qdq` quantizing what they computed, `hc_collapse_norm`
(and its `_qdq`) the norm's kernel collapsing the streams as it reads them, `rms_norm_rope` (and its
`_qdq`) one kernel doing both for a row.

Numerics against platform/cpu/rules_core.rms_norm and rules_rope.rope:
- rms_norm: the sum of squares is added in another order than torch's mean (a few f32 ulps in the
  factor, so at most one ulp of the output dtype now and then); the rest is the cpu rule's arithmetic;
- rope: the frequency table is the cpu helper's (computed on the host, kept per params and device);
  cos/sin are the f64 values rounded to f32 (the cpu rule's C-library cosf/sinf agree except in rare
  near-midpoint cases); angles and the rotation round as the cpu rule does, so results are nearly
  always bit-equal.
Batch invariant: each program reads one row (rms_norm) or one token's heads (rope), tiles fixed by the
shapes. CPU tensors without Triton's interpreter go to the cpu rules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.ops.fused import inner_params, rope_params
from dsgraph.ops.nn import RMSNormParams
from dsgraph.platform.cpu import rules_core, rules_fused, rules_rope
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels.attention import runs_kernels
from dsgraph.platform.cuda.kernels.mhc import next_pow2, triton_cdiv, triton_dtype
from dsgraph.platform.cuda.kernels.quant_act import epilogue, no_epilogue, then_qdq

__all__ = [
    "RULES",
    "hc_collapse_norm",
    "hc_collapse_norm_qdq",
    "rms_norm",
    "rms_norm_qdq",
    "rms_norm_rope",
    "rms_norm_rope_qdq",
    "rope",
    "rope_qdq",
]

NORM_BLOCK = 1024  # columns per step of rms_norm's two passes over a row
ROPE_BLOCK_H = 4  # heads per rope program (64 query heads: 16 programs per token at decode)
NUM_WARPS = 4


def _launch_norm(
    eps: float, x: Tensor, a: Tensor | None, w: Tensor, out: Tensor, q: Tensor, raw: bool, qdq: dict
) -> None:
    """rms_norm_kernel over the rows of x [*, D], or (a [tokens, n] given) of the collapse of the streams
    x [tokens, n, D]; out / q: the norm's output and its quantization (each written when asked)."""
    from dsgraph.platform.cuda.kernels import norm_rope_tl as K

    width = x.shape[-1]
    rows = out.numel() // width if width else 0
    if rows:
        streams = 0 if a is None else x.shape[1]
        K.rms_norm_kernel[(rows,)](
            x.contiguous(), x if a is None else a.contiguous(), w.contiguous(), out, q, float(eps), D=width,
            N=streams, BLOCK=min(NORM_BLOCK, next_pow2(width)), OUT=triton_dtype(out.dtype), RAW=raw,
            **qdq, num_warps=NUM_WARPS, enable_fp_fusion=False, **pdl.launch(),
        )  # fmt: skip


def rms_norm(p: Any, x: Tensor, w: Tensor) -> Tensor:
    if not runs_kernels(x) or x.dim() == 0:
        return rules_core.rms_norm(p, x, w)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_norm(p.eps, x, None, w, out, out, True, no_epilogue(out))
    return out


def hc_collapse_norm(p: Any, x: Tensor, a: Tensor, w: Tensor) -> Tensor:
    """hc_collapse, then rms_norm of the collapsed row, in one launch (ops/fused.py)."""
    if not runs_kernels(x):
        return rules_fused.hc_collapse_norm(p, x, a, w)
    out = torch.empty((x.shape[0], x.shape[2]), dtype=to_torch(p.out_dtype), device=x.device)
    _launch_norm(p.eps, x, a, w, out, out, True, no_epilogue(out))
    return out


def _norm_qdq(p: Any, x: Tensor, a: Tensor | None, w: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    """rms_norm_qdq (a None) or hc_collapse_norm_qdq: the norm's kernel quantizing its output."""
    shape = tuple(x.shape) if a is None else (x.shape[0], x.shape[2])
    dtype = x.dtype if a is None else to_torch(p.out_dtype)
    fused = epilogue(p, shape, dtype, x.device, shape[-1]) if runs_kernels(x) and x.dim() else None
    if fused is None:
        inner = inner_params(p)
        return then_qdq(p, rms_norm(inner, x, w) if a is None else hc_collapse_norm(inner, x, a, w))
    q, qdq = fused
    out = torch.empty(shape, dtype=dtype, device=x.device) if p.raw else q
    _launch_norm(p.eps, x, a, w, out, q, p.raw, qdq)
    return (out, q) if p.raw else q


def rms_norm_qdq(p: Any, x: Tensor, w: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    return _norm_qdq(p, x, None, w)


def hc_collapse_norm_qdq(p: Any, x: Tensor, a: Tensor, w: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    return _norm_qdq(p, x, a, w)


def _rope_applies(p: Any, x: Tensor) -> bool:
    return runs_kernels(x) and x.dim() >= 2 and p.rope_dim % 2 == 0 and x.shape[-1] >= p.rope_dim


def _launch_rope(p: Any, x: Tensor, positions: Tensor, out: Tensor, q: Tensor, raw: bool, qdq: dict) -> None:
    from dsgraph.platform.cuda.kernels import norm_rope_tl as K

    tokens, width = x.shape[0], x.shape[-1]
    heads = x[0].numel() // width if tokens and width else 1
    if tokens and width:
        grid = (tokens, triton_cdiv(heads, ROPE_BLOCK_H))
        K.rope_kernel[grid](
            x.contiguous(), positions.contiguous(), rules_rope.rope_frequencies(p, x.device), out, q, heads,
            D=width, ROPE=p.rope_dim, INVERSE=bool(p.inverse), BLOCK_H=ROPE_BLOCK_H,
            BLOCK_D=next_pow2(max(width - p.rope_dim, 1)), BLOCK_P=next_pow2(max(p.rope_dim // 2, 1)),
            OUT=triton_dtype(x.dtype), RAW=raw, **qdq, num_warps=NUM_WARPS, enable_fp_fusion=False,
            **pdl.launch(),
        )  # fmt: skip


def rope(p: Any, x: Tensor, positions: Tensor) -> Tensor:
    if not _rope_applies(p, x):
        return rules_rope.rope(p, x, positions)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_rope(p, x, positions, out, out, True, no_epilogue(out))
    return out


def _rope_qdq(p: Any, x: Tensor, plain: Any, launch: Any) -> Tensor | tuple[Tensor, Tensor]:
    """A rope-ending `_qdq` op: `launch(inner, out, q, raw, qdq)` quantizing in the rope's kernel, or
    `plain(inner)` (its op) then act_qdq's launch where that kernel does not apply."""
    inner = inner_params(p)
    # the kernel quantizes the passed-through and the rotated columns of a head apart
    widths = (x.shape[-1] - p.rope_dim, p.rope_dim)
    fused = epilogue(p, tuple(x.shape), x.dtype, x.device, *widths) if _rope_applies(inner, x) else None
    if fused is None:
        return then_qdq(p, plain(inner))
    q, qdq = fused
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if p.raw else q
    launch(inner, out, q, p.raw, qdq)
    return (out, q) if p.raw else q


def rope_qdq(p: Any, x: Tensor, positions: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    return _rope_qdq(
        p,
        x,
        lambda inner: rope(inner, x, positions),
        lambda inner, *out: _launch_rope(inner, x, positions, *out),
    )


def _launch_norm_rope(
    p: Any, x: Tensor, w: Tensor, positions: Tensor, out: Tensor, q: Tensor, raw: bool, qdq: dict
) -> None:
    from dsgraph.platform.cuda.kernels import norm_rope_tl as K

    tokens, width = x.shape[0], x.shape[-1]
    rows = x.numel() // width if width else 0
    if rows:
        freq = rules_rope.rope_frequencies(rope_params(p), x.device)
        K.norm_rope_kernel[(rows,)](
            x.contiguous(), w.contiguous(), positions.contiguous(), freq,
            out, q, float(p.eps), rows // tokens, D=width, ROPE=p.rope_dim, INVERSE=bool(p.inverse),
            BLOCK=min(NORM_BLOCK, next_pow2(width)), BLOCK_P=next_pow2(max(p.rope_dim // 2, 1)),
            OUT=triton_dtype(x.dtype), RAW=raw, **qdq, num_warps=NUM_WARPS, enable_fp_fusion=False,
            **pdl.launch(),
        )  # fmt: skip


def rms_norm_rope(p: Any, x: Tensor, w: Tensor, positions: Tensor) -> Tensor:
    """rms_norm then rope (ops/fused.py) in one launch; shapes the rope kernel does not take run the two
    rules."""
    if not _rope_applies(p, x):
        return rope(rope_params(p), rms_norm(RMSNormParams(eps=p.eps), x, w), positions)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch_norm_rope(p, x, w, positions, out, out, True, no_epilogue(out))
    return out


def rms_norm_rope_qdq(p: Any, x: Tensor, w: Tensor, positions: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    return _rope_qdq(
        p,
        x,
        lambda inner: rms_norm_rope(inner, x, w, positions),
        lambda inner, *out: _launch_norm_rope(inner, x, w, positions, *out),
    )


RULES: dict[str, Any] = {
    "rms_norm": rms_norm,
    "rope": rope,
    "rms_norm_qdq": rms_norm_qdq,
    "rope_qdq": rope_qdq,
    "hc_collapse_norm": hc_collapse_norm,
    "hc_collapse_norm_qdq": hc_collapse_norm_qdq,
    "rms_norm_rope": rms_norm_rope,
    "rms_norm_rope_qdq": rms_norm_rope_qdq,
}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them)
KERNELS: dict[str, tuple[str, ...]] = {
    "rms_norm": ("norm_rope_tl.rms_norm_kernel",),
    "rope": ("norm_rope_tl.rope_kernel",),
    "rms_norm_qdq": ("norm_rope_tl.rms_norm_kernel", "quant_act_tl.qdq_kernel"),
    "rope_qdq": ("norm_rope_tl.rope_kernel", "quant_act_tl.qdq_kernel"),
    "hc_collapse_norm": ("norm_rope_tl.rms_norm_kernel",),
    "hc_collapse_norm_qdq": ("norm_rope_tl.rms_norm_kernel", "quant_act_tl.qdq_kernel"),
    "rms_norm_rope": ("norm_rope_tl.norm_rope_kernel",),
    "rms_norm_rope_qdq": ("norm_rope_tl.norm_rope_kernel", "quant_act_tl.qdq_kernel"),
}
