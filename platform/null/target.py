"""Null rules record what a step would launch; they never compute."""

from __future__ import annotations

from typing import Any

import dsgraph.ops  # noqa: F401  (declares the ops)
from dsgraph.graph.op import all_ops
from dsgraph.platform.registry import Platform


def launch(_params: Any, *_operands: Any) -> None:
    """A null launch: running a null program is an error, it only exists to be lowered and planned."""
    raise RuntimeError("the null platform does not execute; lower it for checks and plans only")


PLATFORM = Platform("null", {op.name: launch for op in all_ops()}, executes=False)
