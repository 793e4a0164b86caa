"""Random V4 weights from a config alone (`load_format="dummy"`): the tiny checkpoint's random init
(`tiny.random_weights`), quantized to the released on-disk format and converted as a loaded checkpoint
is (`weights.prepare_weights`), so the graph reads the same kinds of tensors a real checkpoint gives.
Generated on the host and moved to `device` (the whole checkpoint is held on the host once)."""

from __future__ import annotations

from torch import Tensor

from dsgraph.models.deepseek_v4.config import V4Config
from dsgraph.models.deepseek_v4.tiny import quantize_weights, random_weights
from dsgraph.models.deepseek_v4.weights import prepare_weights
from dsgraph.models.deepseek_v41.numerics import Numerics

__all__ = ["dummy_weights"]


def dummy_weights(cfg: V4Config, num: Numerics, device: str, seed: int = 0) -> dict[str, Tensor]:
    """The step graph's weight inputs for `num`, random, on `device`; like a loaded checkpoint's, without
    the MTP layer, as V4.1's dummy weights come without DSpark stages: random draft layers would only slow
    `auto` down, and `speculative="mtp"` says the layer is missing."""
    stored = quantize_weights(cfg, random_weights(cfg, seed))
    return {k: v.to(device) for k, v in prepare_weights(cfg, stored, num).items()}
