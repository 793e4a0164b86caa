"""Quantization boundaries shared between our engine and NeMo.

The model rounds activations to FP8/FP4 at cache boundaries (spec 3.3). Two correct f32 implementations
differ by ~1e-7, and a value that lands within that distance of a rounding boundary rounds to a different
code in each (a *flip*), after which the two runs legitimately drift apart. To compare whole sequences
exactly, NeMo is run with *our* rounded values substituted at every boundary, after checking that NeMo's
own inputs to each boundary agree with ours to `INPUT_TOL` (so a substituted flip is noise, never a bug).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from nemo_automodel.components.models.deepseek_v41 import attention as nemo_attention

from dsgraph.platform.cpu.quant import fp8_g32_qdq, mxfp4_g32_qdq, nvfp4_g16_qdq

INPUT_TOL = 1e-5  # relative to the boundary tensor's largest magnitude
_QDQ = {"kv": fp8_g32_qdq, "iq": mxfp4_g32_qdq, "kidx": mxfp4_g32_qdq, "ckv": nvfp4_g16_qdq}


@dataclass
class Boundaries:
    ours: dict[tuple[int, str], torch.Tensor]  # our pre-rounding values in NeMo's layout (no batch dim)
    rows: dict[tuple[int, str], list[int]]  # the sequence row of each of those values
    errors: dict[tuple[int, str], torch.Tensor] = field(
        default_factory=dict
    )  # relative input error per value
    flips: int = 0  # values whose rounding differs between NeMo's input and ours

    def max_error(self, before_row: int | None = None) -> float:
        """Largest relative difference of NeMo's boundary inputs from ours (rows < before_row)."""
        worst = 0.0
        for key, err in self.errors.items():
            keep = [i for i, t in enumerate(self.rows[key]) if before_row is None or t < before_row]
            worst = max([worst] + [float(err[i]) for i in keep])
        return worst


def ours_in_nemo_layout(debug: dict[str, torch.Tensor], ratios: dict[int, int]) -> Boundaries:
    """Our boundary inputs by (layer, kind); compressed entries keep only the rows that close a group."""
    ours: dict[tuple[int, str], torch.Tensor] = {}
    rows: dict[tuple[int, str], list[int]] = {}
    for name, value in debug.items():
        kind, _, layer = name.partition("_pre.")
        if not layer:
            continue
        keep = list(range(value.shape[0]))
        if kind in ("ckv", "kidx"):
            keep = [t for t in keep if (t + 1) % ratios[int(layer)] == 0]
        ours[(int(layer), kind)], rows[(int(layer), kind)] = value[keep], keep
    return Boundaries(ours, rows)


@contextmanager
def substituted_boundaries(model, b: Boundaries) -> Iterator[Boundaries]:  # type: ignore[no-untyped-def]
    """Inside the block, NeMo's cache quantizer checks its input against ours and returns our rounding."""
    current = {"layer": -1}
    original = nemo_attention.quantize_cache

    def spy(x: torch.Tensor, *, format: str, block_size: int) -> torch.Tensor:  # noqa: A002
        kind = {"fp8": "kv", "nvfp4": "ckv"}.get(format) or ("iq" if x.dim() == 4 else "kidx")
        key = (current["layer"], kind)
        mine = b.ours[key]
        theirs = x[0].detach()
        assert mine.shape == theirs.shape, (
            f"layer {key}: ours {tuple(mine.shape)} vs NeMo {tuple(theirs.shape)}"
        )
        if not mine.numel():
            return original(x, format=format, block_size=block_size)
        scale = theirs.abs().max().clamp_min(1e-30)
        b.errors[key] = (mine - theirs).flatten(1).abs().amax(-1) / scale
        rounded = _QDQ[kind](mine.flatten(1)).view_as(mine)
        b.flips += int((rounded != _QDQ[kind](theirs.flatten(1)).view_as(theirs)).flatten(1).any(-1).sum())
        return rounded.unsqueeze(0).to(x.dtype)

    def enter(layer: int):  # type: ignore[no-untyped-def]
        return lambda mod, args: current.__setitem__("layer", layer)

    hooks = [
        m.register_forward_pre_hook(enter(int(n.split(".")[2])))
        for n, m in model.named_modules()
        if isinstance(m, nemo_attention.DeepseekV41Attention)
    ]
    nemo_attention.quantize_cache = spy
    try:
        yield b
    finally:
        nemo_attention.quantize_cache = original
        for h in hooks:
            h.remove()
