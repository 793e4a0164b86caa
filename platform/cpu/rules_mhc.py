"""Reference meaning of hc_pre, hc_collapse and hc_expand, in torch (spec model-v41 4.4)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.step_rows import rowwise_linear


def sinkhorn(logits: Tensor, iters: int, eps: float) -> Tensor:
    """[..., n, n] logits -> a near doubly-stochastic matrix: row softmax (+eps), then alternate
    column and row normalisation (each sum + eps in the denominator), `iters` column steps in all."""
    comb = invariant.softmax(logits, -1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def hc_pre(p: Any, x: Tensor, fn: Tensor, base: Tensor, scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    n = x.shape[1]
    flat = x.float().flatten(1)  # [tokens, n*H], stream-major
    # Projection first, then the per-token RMS factor: the released kernel's order.
    mix = rowwise_linear(flat, fn) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + p.norm_eps)
    scales = torch.cat((scale[0].expand(n), scale[1].expand(n), scale[2].expand(n * n)))
    # base + mix * scales as one fused multiply-add, as the released kernel rounds it.
    z = invariant.fused_multiply_add(base, mix, scales)
    # Sigmoid and the sinkhorn softmax in f64 (platform/cpu/invariant.py): batch invariant.
    pre = invariant.sigmoid(z[:, :n]) + p.eps
    post = 2 * invariant.sigmoid(z[:, n : 2 * n])
    comb = sinkhorn(z[:, 2 * n :].unflatten(-1, (n, n)), p.sinkhorn_iters, p.eps)
    return pre, post, comb


def hc_collapse(p: Any, x: Tensor, a: Tensor) -> Tensor:
    return (a.unsqueeze(-1) * x.float()).sum(1).to(to_torch(p.out_dtype))


# Token rows per hc_expand chunk: a chunk's f32 [rows, n, H] temporaries hold at most this many elements
# (256 MiB each), so the rule's extra memory stays bounded whatever the token count (a 64k-token prefill
# would otherwise build f32 products of the whole step).
EXPAND_CHUNK_ELEMENTS = 1 << 26


def _expand_rows(y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """hc_expand of a few token rows. The sum over input streams i of comb[i, j] x_i runs from 0 in
    increasing i, one [rows, n_out, H] product at a time: the order torch's sum over that dim takes for
    n <= 4 (bit-equal), without the [rows, n_in, n_out, H] product tensor (8n times the output's bytes)."""
    mixed = torch.zeros((x.shape[0], x.shape[1], x.shape[2]), dtype=torch.float32, device=x.device)
    for i in range(x.shape[1]):
        mixed += comb[:, i, :, None] * x[:, i, None, :].float()
    update = post.unsqueeze(-1) * y.float().unsqueeze(1)  # [rows, n_out, H]
    return torch.add(update, mixed, out=mixed).to(x.dtype)


def hc_expand(_p: Any, y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    tokens, n, hidden = x.shape
    rows = max(1, EXPAND_CHUNK_ELEMENTS // max(1, n * hidden))
    if tokens <= rows:
        return _expand_rows(y, x, post, comb)
    # Row chunks: every op is per token, so chunking changes no value.
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    for start in range(0, tokens, rows):
        part = slice(start, start + rows)
        out[part] = _expand_rows(y[part], x[part], post[part], comb[part])
    return out


RULES: dict[str, Any] = {"hc_pre": hc_pre, "hc_collapse": hc_collapse, "hc_expand": hc_expand}
