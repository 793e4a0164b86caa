"""Reference meaning of the core, shape and nn ops, in torch. Float math that the op docs say is
f32 is computed in f32 and rounded once to the result dtype."""

from __future__ import annotations

from typing import Any

import torch

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.quant import fp8_block_dequantize, fp8_g32_qdq
from dsgraph.platform.cpu.step_rows import checking, rowwise_linear

Tensor = torch.Tensor


def _f32(x: Tensor) -> Tensor:
    return x.float() if x.is_floating_point() else x


def _elementwise(fn: Any) -> Any:
    def rule(_p: Any, *xs: Tensor) -> Tensor:
        return fn(*xs)

    rule.__qualname__ = getattr(fn, "__name__", "elementwise")
    return rule


def _unary_f32(fn: Any) -> Any:
    def rule(_p: Any, x: Tensor) -> Tensor:
        return fn(x.float()).to(x.dtype)

    rule.__qualname__ = getattr(fn, "__name__", "unary")
    return rule


def _reduce(fn: Any) -> Any:
    def rule(p: Any, x: Tensor) -> Tensor:
        return fn(_f32(x), dim=p.axes, keepdim=p.keepdims).to(x.dtype)

    rule.__qualname__ = f"reduce_{fn.__name__}"
    return rule


def _reduce_max(x: Tensor, dim: tuple[int, ...], keepdim: bool) -> Tensor:
    return torch.amax(x, dim=dim, keepdim=keepdim)


def cast(p: Any, x: Tensor) -> Tensor:
    return x.to(to_torch(p.dtype))


def add_f32(p: Any, a: Tensor, b: Tensor) -> Tensor:
    return (a.to(torch.float32) + b.to(torch.float32)).to(to_torch(p.out_dtype))


def matmul(_p: Any, a: Tensor, b: Tensor) -> Tensor:
    # Each output on its own: torch.matmul's rounding depends on the batch (platform/cpu/invariant.py).
    return invariant.matmul(a, b).to(a.dtype)


def reshape(p: Any, x: Tensor) -> Tensor:
    return x.reshape(p.shape)


def transpose(p: Any, x: Tensor) -> Tensor:
    return x.permute(p.perm).contiguous()


def broadcast_to(p: Any, x: Tensor) -> Tensor:
    return x.broadcast_to(p.shape).contiguous()


def concat(p: Any, *xs: Tensor) -> Tensor:
    return torch.cat(xs, dim=p.axis)


def slice_(p: Any, x: Tensor) -> Tensor:
    return x.narrow(p.axis, p.start, p.stop - p.start).contiguous()


def gather_rows(_p: Any, table: Tensor, index: Tensor) -> Tensor:
    if checking() and index.numel() and (int(index.min()) < 0 or int(index.max()) >= table.shape[0]):
        bad = index[(index < 0) | (index >= table.shape[0])][0]
        raise IndexError(f"gather_rows: index {int(bad)} outside [0, {table.shape[0]})")
    # index_select takes i32 indices as they are (indexing would launch a cast to i64 first on cuda)
    return table.index_select(0, index.reshape(-1)).reshape(*index.shape, *table.shape[1:])


def rms_norm(p: Any, x: Tensor, w: Tensor) -> Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + p.eps)
    return (w.float() * y).to(x.dtype)


def softmax(p: Any, x: Tensor) -> Tensor:
    return invariant.softmax(x.float(), p.axis).to(x.dtype)


def linear_operands(p: Any, x: Tensor, w: Tensor, *scale: Tensor) -> tuple[Tensor, Tensor]:
    """f32 GEMM operands of linear/grouped_linear: x (FP8-g32 qdq'ed if act_quant says), the dense weight."""
    xf = fp8_g32_qdq(x.float()) if p.act_quant == "fp8_g32" else x.float()
    wf = w.float() if p.weight_format == "dense" else fp8_block_dequantize(w, *scale, dtype=torch.float32)
    return xf, wf


def linear(p: Any, x: Tensor, w: Tensor, *scale: Tensor) -> Tensor:
    # Row by row: the cpu reference is batch invariant (a row's result never depends on the batch).
    return rowwise_linear(*linear_operands(p, x, w, *scale)).to(to_torch(p.out_dtype))


RULES: dict[str, Any] = {
    "add": _elementwise(torch.add),
    "sub": _elementwise(torch.sub),
    "mul": _elementwise(torch.mul),
    "div": _elementwise(torch.div),
    "floor_div": _elementwise(lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "maximum": _elementwise(torch.maximum),
    "minimum": _elementwise(torch.minimum),
    "less": _elementwise(torch.lt),
    "equal": _elementwise(torch.eq),
    "where": _elementwise(torch.where),
    "neg": _elementwise(torch.neg),
    "abs": _elementwise(torch.abs),
    # Transcendentals in f64, rounded once: torch's f32 kernels round some of them differently on the
    # vector body and the tail, so a row's value would depend on the batch (platform/cpu/invariant.py).
    "exp": _unary_f32(invariant.exp),
    "log": _unary_f32(invariant.log),
    "sqrt": _unary_f32(torch.sqrt),
    "rsqrt": _unary_f32(torch.rsqrt),
    "sigmoid": _unary_f32(invariant.sigmoid),
    "silu": _unary_f32(invariant.silu),
    "relu": _unary_f32(torch.relu),
    "softplus": _unary_f32(invariant.softplus),
    "cast": cast,
    "add_f32": add_f32,
    "reduce_sum": _reduce(torch.sum),
    "reduce_max": _reduce(_reduce_max),
    "reduce_mean": _reduce(torch.mean),
    "matmul": matmul,
    "reshape": reshape,
    "transpose": transpose,
    "broadcast_to": broadcast_to,
    "concat": concat,
    "slice": slice_,
    "gather_rows": gather_rows,
    "rms_norm": rms_norm,
    "softmax": softmax,
    "linear": linear,
}
