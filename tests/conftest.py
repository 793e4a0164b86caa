"""Suite-wide pytest hooks: `gpu`-marked tests skip where no CUDA device is present."""

from __future__ import annotations

import pytest
import torch

# The models under test are tiny: one thread is faster than two fighting over small kernels, and it
# keeps CPU timings comparable between machines.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: torch.cuda.is_available() is False")
    for item in gpu_items:
        item.add_marker(skip)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite the golden dumps under tests/golden from the current code (the diff is the review)",
    )


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """Whether this run rewrites the golden files (`--update-goldens`) instead of comparing them."""
    return bool(request.config.getoption("--update-goldens"))
