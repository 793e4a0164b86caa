"""Loading a V4 checkpoint directory into the step graph's weight inputs, the MTP layer's included when
the checkpoint holds it in this project's layout (`mtp.mtp_tensors`).

The MTP tensor names are this project's, not checked against the released V4-Flash weights, so a
checkpoint whose `mtp.*` tensors do not match that layout exactly loads without them (as before drafting
existed): the backbone serves, and asking to draft names what is missing (models/registry.py, the V4
family's `Drafting.missing`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors, is_skipped
from dsgraph.models.deepseek_v4.config import V4Config
from dsgraph.models.deepseek_v4.mtp import mtp_tensors
from dsgraph.models.deepseek_v4.weights import prepare_weights
from dsgraph.models.deepseek_v41.checkpoint_io import _weight_map, load_checkpoint
from dsgraph.models.deepseek_v41.numerics import Numerics

__all__ = ["has_mtp_layout", "load_weights", "with_mtp"]


def has_mtp_layout(root: Path, cfg: V4Config) -> bool:
    """Whether the checkpoint stores every tensor of the config's MTP layer under this project's names."""
    mtp = mtp_tensors(cfg)
    if not mtp:
        return False
    names = _weight_map(root, lambda _name: False)
    return all(name in names for name in mtp)


def with_mtp(cfg: V4Config, stored: dict[str, Tensor], num: Numerics) -> dict[str, Tensor]:
    """The backbone's weight inputs plus the MTP layer's (`stored` holds both)."""
    return {**prepare_weights(cfg, stored, num), **prepare_weights(cfg, stored, num, mtp_tensors(cfg))}


def load_weights(root: Path, cfg: V4Config, num: Numerics, check_finite: bool | None) -> dict[str, Any]:
    """The step graph's weight inputs (and the MTP layer's, when `has_mtp_layout`)."""
    if not has_mtp_layout(root, cfg):
        stored = load_checkpoint(
            root,
            cfg,
            progress=True,
            check_finite=check_finite,
            expected=expected_tensors(cfg),
            skipped=is_skipped,
        )
        return prepare_weights(cfg, stored, num)
    expected = {**expected_tensors(cfg), **mtp_tensors(cfg)}
    stored = load_checkpoint(
        root, cfg, progress=True, check_finite=check_finite, expected=expected, skipped=lambda _name: False
    )
    return with_mtp(cfg, stored, num)
