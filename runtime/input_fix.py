"""The device-side correction of an overlapped step's inputs (zero-overhead scheduling).

A step planned while the previous one still runs does not know the tokens that step samples: its plan
holds 0 there and names, per row (`StepPlan.token_src`) and per lookback entry (`lookback_src`), the
previous step's sample row that holds the token (-1: the host value is right). `fix_inputs` copies those
tokens in on the device, device to device, after the step's inputs are staged and before the step runs:
two gathers and two selects on the step's stream, no host sync. Positions, slots, pages and sequence
bounds do not depend on the token, so they are right on the host already. The Engram n-gram windows are
computed inside the step from `token_ids` and `lookback`, so correcting those two corrects them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

# step input -> the plan array naming, per entry, the previous step's sample row it takes its token from
FIXED_INPUTS: dict[str, str] = {"token_ids": "token_src", "lookback": "lookback_src"}


@dataclass(frozen=True)
class InputFix:
    """What an overlapped step's inputs take from the previous step: its sampled tokens (on the device,
    [outs] int) and, per fixed input, the source rows (`FIXED_INPUTS`; same shape as the input)."""

    prev_tokens: torch.Tensor
    sources: Mapping[str, np.ndarray]

    @staticmethod
    def of(plan: object, prev_tokens: torch.Tensor | None) -> InputFix | None:
        """The fix of `plan` (a StepPlan) from the previous step's device tokens; None when the plan takes
        nothing from it. RuntimeError when it does but no previous step's tokens are given."""
        sources = {name: np.asarray(getattr(plan, src)) for name, src in FIXED_INPUTS.items()}
        if not any((s >= 0).any() for s in sources.values()):
            return None
        if prev_tokens is None:
            raise RuntimeError(
                "InputFix: the plan takes tokens from the previous step's samples (token_src/lookback_src "
                ">= 0) but no previous step was sampled on the device"
            )
        return InputFix(prev_tokens, sources)


def fix_inputs(
    inputs: Mapping[str, torch.Tensor],
    sources: Mapping[str, torch.Tensor | np.ndarray],
    prev_tokens: torch.Tensor,
) -> None:
    """In place: inputs[name][i] = prev_tokens[sources[name][i]] where sources[name][i] >= 0, for every
    name of `sources` (tensors, staged on the inputs' device, or host arrays, copied there; padded with
    -1 to the inputs' shapes)."""
    if prev_tokens.numel() == 0:
        return
    for name, source in sources.items():
        target = inputs[name]
        src = torch.as_tensor(source, device=target.device)
        if src.shape != target.shape:
            raise ValueError(
                f"fix_inputs: {name} source shape {list(src.shape)}, expected {list(target.shape)}"
            )
        taken = prev_tokens.to(target.device)[src.clamp(min=0).long()].to(target.dtype)
        target.copy_(torch.where(src >= 0, taken, target))


def padded_sources(fix: InputFix | None, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Source arrays padded with -1 to the bucket's shapes (all -1 without a fix), as int32."""
    out = {}
    for name, shape in shapes.items():
        arr = np.full(shape, -1, dtype=np.int32)
        if fix is not None:
            src = np.asarray(fix.sources[name], dtype=np.int32).reshape(-1, *shape[1:])
            arr[: src.shape[0]] = src
        out[name] = arr
    return out
