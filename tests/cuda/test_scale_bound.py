"""The host-side bound that picks the asm MoE upcast's one-multiply form (cuda/scale_bound.py):
right for every byte, read once per tensor version, never read back during a capture."""

from __future__ import annotations

import pytest
import torch

from dsgraph.platform.cuda import scale_bound
from dsgraph.platform.cuda.scale_bound import scales_at_most_128
from tests.cuda.kernel_env import DEVICE, ON_GPU


def _scales(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=DEVICE).view(torch.float8_e8m0fnu)


BYTES = [(0, True), (1, True), (127, True), (128, True), (129, False), (255, False)]


@pytest.mark.parametrize("byte, ok", BYTES)
def test_the_bound_holds_exactly_up_to_byte_128(byte: int, ok: bool) -> None:
    assert scales_at_most_128(_scales(120, byte, 3)) is ok


def test_every_tensor_counts_and_none_is_skipped() -> None:
    small, large = _scales(120, 121), _scales(120, 200)
    assert scales_at_most_128(small, None, small)
    assert not scales_at_most_128(small, None, large)
    assert scales_at_most_128(_scales())  # no byte at all


def test_an_in_place_write_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is kept per tensor and version: a second call reads nothing back, an in-place write
    (as a reload into the same storage) makes the next call read again."""
    s = _scales(120, 121, 122)
    assert scales_at_most_128(s)
    reads: list[int] = []
    real = torch.Tensor.max
    monkeypatch.setattr(torch.Tensor, "max", lambda t, *a, **k: reads.append(1) or real(t, *a, **k))
    assert scales_at_most_128(s) and not reads
    s.view(torch.uint8)[1] = 140
    assert not scales_at_most_128(s) and reads


def test_a_dead_tensor_leaves_no_entry() -> None:
    s = _scales(1, 2)
    key = id(s)
    scales_at_most_128(s)
    assert key in scale_bound._KNOWN
    del s
    assert key not in scale_bound._KNOWN


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="a CUDA-graph capture needs a GPU")
def test_a_tensor_first_seen_while_capturing_gets_the_two_multiply_form() -> None:
    s = _scales(120, 121)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        seen = scales_at_most_128(s)
    assert seen is False
    assert scales_at_most_128(s) is True  # read once outside the capture
