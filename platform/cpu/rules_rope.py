"""Reference meaning of the rope op, in torch (spec model-v41 3.2).

The frequency table and the rotation reproduce the references' FP32 rounding bit for bit: the
frequency is the reciprocal of theta^(2j/d) (not theta^(-2j/d)), the YaRN blend is
(w/factor)*r + w*(1-r), and the rotation is a complex multiply (separate real multiplies round some
values differently, which can move a value across a later FP8/FP4 bin).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.ops.rope import yarn_bounds


def rope_frequencies(p: Any) -> Tensor:
    """f32 [rope_dim / 2]: the angular frequency w_j of pair j, YaRN-corrected when yarn_factor > 1."""
    exponents = torch.arange(0, p.rope_dim, 2, dtype=torch.float32) / p.rope_dim
    freqs = 1.0 / (p.theta**exponents)
    if p.yarn_factor > 1.0:
        lo, hi = yarn_bounds(p.rope_dim, p.theta, p.beta_fast, p.beta_slow, p.original_max)
        ramp = ((torch.arange(p.rope_dim // 2, dtype=torch.float32) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
        freqs = freqs / p.yarn_factor * ramp + freqs * (1 - ramp)
    return freqs


def rope(p: Any, x: Tensor, positions: Tensor) -> Tensor:
    angles = positions.float().unsqueeze(-1) * rope_frequencies(p)  # [tokens, rope_dim / 2]
    angles = angles.reshape(angles.shape[0], *([1] * (x.dim() - 2)), angles.shape[-1])  # broadcast over heads
    rotation = torch.polar(torch.ones_like(angles), angles)
    if p.inverse:
        rotation = rotation.conj()
    pairs = torch.view_as_complex(x[..., -p.rope_dim :].float().unflatten(-1, (-1, 2)).contiguous())
    rotated = torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)
    return torch.cat((x[..., : -p.rope_dim], rotated), dim=-1)


RULES: dict[str, Any] = {"rope": rope}
