"""Reference meaning of the MoE ops (dsgraph.ops.moe), in torch (spec model-v41 4.6).

Router and expert math is f32. The expert loop visits only the experts some row selected, in
increasing id order, and dequantizes one expert's weights at a time (tiny shapes are the goal).
"""

from __future__ import annotations

from typing import Any

import torch

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.quant import fp4_rows_dequantize, fp8_g32_qdq
from dsgraph.platform.cpu.step_rows import checking, rowwise_linear

Tensor = torch.Tensor

# NeMo's (and DeepInfer's) guard in the renormalisation of the selected scores.
_RENORM_EPS = 1e-20


def moe_route(p: Any, u: Tensor, gate_w: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    # softplus in f64 (platform/cpu/invariant.py): torch's f32 kernel rounds by position in the tensor.
    scores = torch.sqrt(invariant.softplus(rowwise_linear(u.float(), gate_w.float())))
    return route_select(p, scores, bias)


def route_select(p: Any, scores: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """The top-k experts of scores + bias and their renormalised unbiased scores (f32 weights, i32 ids)."""
    # A stable descending sort keeps equal scores in id order: ties go to the lowest expert id.
    ids = torch.sort(scores + bias, dim=-1, descending=True, stable=True).indices[:, : p.topk]
    chosen = scores.gather(1, ids)
    weights = chosen / (chosen.sum(dim=-1, keepdim=True) + _RENORM_EPS) * p.routed_scaling
    return weights, ids.to(torch.int32)


def swiglu_f32(g: Tensor, v: Tensor, limit: float) -> Tensor:
    """silu(min(g, limit)) * clamp(v, -limit, limit) in f32 (the clamp is one-sided on the gate)."""
    return invariant.silu(g.float().clamp(max=limit)) * v.float().clamp(min=-limit, max=limit)


def swiglu(p: Any, g: Tensor, v: Tensor) -> Tensor:
    return swiglu_f32(g, v, p.limit).to(to_torch(p.out_dtype))


def _check_ids(ids: Tensor, num_experts: int) -> None:
    bad = ids >= num_experts
    if checking() and bool(bad.any()):
        row, slot = (int(i) for i in bad.nonzero()[0])
        raise IndexError(
            f"moe_experts: ids[{row}, {slot}] = {int(ids[row, slot])} is outside [0, {num_experts}) "
            "(negative ids mark padding)"
        )


def _expert_weights(p: Any, e: int, ws: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """(w1 [I, H], w3 [I, H], w2 [H, I]) of expert e in f32."""
    if p.weight_format == "dense":
        return ws[0][e].float(), ws[1][e].float(), ws[2][e].float()
    w1, w3, w2, s1, s3, s2 = ws
    return (
        fp4_rows_dequantize(w1[e], s1[e]),
        fp4_rows_dequantize(w3[e], s3[e]),
        fp4_rows_dequantize(w2[e], s2[e]),
    )


def _gemm_input(p: Any, a: Tensor, dtype: torch.dtype) -> Tensor:
    """The activation as the GEMM reads it: FP8-qdq'd (DeepInfer) or rounded to the activation dtype."""
    if p.act_quant == "fp8_g32":
        return fp8_g32_qdq(a.float())
    return a.to(dtype).float()


def _gemm(p: Any, a: Tensor, w: Tensor) -> Tensor:
    """One expert GEMM a . w^T in f32, its output rounded to gemm_out_dtype (element-wise, so batch
    invariant; DeepInfer's expert GEMMs write BF16)."""
    y = rowwise_linear(a, w)
    return y if p.gemm_out_dtype == "f32" else y.to(to_torch(p.gemm_out_dtype)).float()


def moe_experts(p: Any, x: Tensor, ids: Tensor, weights: Tensor, *ws: Tensor) -> Tensor:
    _check_ids(ids, ws[0].shape[0])
    xin = _gemm_input(p, x, x.dtype)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        w1, w3, w2 = _expert_weights(p, e, ws)
        h = xin[rows]
        act = swiglu_f32(_gemm(p, h, w1), _gemm(p, h, w3), p.swiglu_limit) * weights[rows, slots, None]
        # A row's experts add in increasing id order whatever the batch: the f32 sum is batch invariant.
        out.index_add_(0, rows, _gemm(p, _gemm_input(p, act, x.dtype), w2))
    return out.to(to_torch(p.out_dtype))


def moe_dispatch(_p: Any, x: Tensor, ids: Tensor, weights: Tensor) -> tuple[Tensor, ...]:
    """One rank: every expert is here, the rows stay as they are (an EP group binds its own rule)."""
    return x, ids, weights, torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)


def moe_combine(_p: Any, y: Tensor, _src: Tensor, _ids: Tensor) -> Tensor:
    return y


RULES: dict[str, Any] = {
    "moe_route": moe_route,
    "moe_dispatch": moe_dispatch,
    "moe_combine": moe_combine,
    "moe_experts": moe_experts,
    "swiglu": swiglu,
}
