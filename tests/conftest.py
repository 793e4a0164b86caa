"""Suite-wide pytest hooks: `gpu`-marked tests skip where no CUDA device is present."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    # torch is imported only when a gpu test was collected: importing it costs
    # seconds, which device-free runs of tests/unit should not pay.
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: torch.cuda.is_available() is False")
    for item in gpu_items:
        item.add_marker(skip)
