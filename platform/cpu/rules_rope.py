"""Reference meaning of the rope op, in torch (spec model-v41 3.2).

The frequency table and the rotation reproduce the references' FP32 rounding bit for bit: the
frequency is the reciprocal of theta^(2j/d) (not theta^(-2j/d)), the YaRN blend is (w/factor)*r +
w*(1-r), cos and sin are torch.polar's, and the rotation rounds like the vector body of torch's
complex multiply (another rounding changes some values, which can move a value across a later FP8/FP4
bin). Unlike torch's complex multiply, whose scalar tail rounds differently, the rotation here rounds
every element the same way: batch invariant (platform/cpu/invariant.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch._guards import detect_fake_mode

from dsgraph.ops.rope import yarn_bounds
from dsgraph.platform.cpu import invariant

_TABLES: dict[tuple[Any, str], Tensor] = {}


def rope_frequencies(p: Any, device: torch.device | None = None) -> Tensor:
    """f32 [rope_dim / 2]: the angular frequency w_j of pair j, YaRN-corrected when yarn_factor > 1.

    Always computed on the host and then moved: a device's pow may differ by an ulp, which positions
    near 1M turn into angles off by 0.1 rad. Tables on a device are kept per (params, device), filled
    by the eager run that precedes every CUDA-graph capture. Under a fake-tensor probe the table is
    made afresh and not kept: a kept fake table would break every later real run."""
    where = device if device is not None else "cpu"
    if detect_fake_mode() is not None:  # a capture probe (platform/cuda/capture.py): keep no fake table
        return _host_frequencies(p).to(where)
    key = (p, str(where))
    if key not in _TABLES:
        _TABLES[key] = _host_frequencies(p).to(where)
    return _TABLES[key]


def _host_frequencies(p: Any) -> Tensor:
    exponents = torch.arange(0, p.rope_dim, 2, dtype=torch.float32) / p.rope_dim
    freqs = 1.0 / (p.theta**exponents)
    if p.yarn_factor > 1.0:
        lo, hi = yarn_bounds(p.rope_dim, p.theta, p.beta_fast, p.beta_slow, p.original_max)
        ramp = ((torch.arange(p.rope_dim // 2, dtype=torch.float32) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
        freqs = freqs / p.yarn_factor * ramp + freqs * (1 - ramp)
    return freqs


def rope(p: Any, x: Tensor, positions: Tensor) -> Tensor:
    angles = positions.float().unsqueeze(-1) * rope_frequencies(p, positions.device)  # [tokens, rope_dim / 2]
    angles = angles.reshape(angles.shape[0], *([1] * (x.dim() - 2)), angles.shape[-1])  # broadcast over heads
    cos, sin = invariant.cos_sin(angles)
    if p.inverse:
        sin = -sin
    pairs = x[..., -p.rope_dim :].float().unflatten(-1, (-1, 2))
    real, imag = invariant.rotate_pairs(pairs[..., 0], pairs[..., 1], cos, sin)
    rotated = torch.stack((real, imag), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat((x[..., : -p.rope_dim], rotated), dim=-1)


RULES: dict[str, Any] = {"rope": rope}
