"""The cuda rule of V4's `window_compress` (platform/cuda/kernels/cache.py: the projections through the
linear kernel, then the cpu rule's pooling and ring writes) against the cpu rule: two sequences, one
continuing from its state ring, padding rows, overlapping (CSA) and plain (HCA) windows; and the
unchecked path (a fixed count of closing rows, no host read: what a CUDA graph captures) gives the
checked path's bits. On a CUDA machine the kernels run on the GPU, elsewhere under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.models.deepseek_v41.step_io import ROLLBACK_ROOM  # noqa: E402
from dsgraph.ops.window_compress import WindowCompressParams, window_span  # noqa: E402
from dsgraph.platform.cpu import rules_window  # noqa: E402
from dsgraph.platform.cpu.step_rows import unchecked  # noqa: E402
from dsgraph.platform.cuda.kernels import cache as cuda_cache  # noqa: E402
from tests.cuda.kernel_env import on_device  # noqa: E402

HIDDEN, WIDTH = 64, 32


def _operands(ratio: int, overlap: bool) -> list[torch.Tensor]:
    """Sequence 0 continues at position 5 (its ring holds positions 0..4), sequence 1 starts at 0; two
    padding rows at the end."""
    g = torch.Generator().manual_seed(ratio)
    width = 2 * WIDTH if overlap else WIDTH
    ring = window_span(ratio, overlap) + ROLLBACK_ROOM - 1
    positions = list(range(5, 15)) + list(range(0, 7)) + [0, 0]
    seq_ids = [0] * 10 + [1] * 7 + [-1, -1]
    return [
        torch.randn(len(positions), HIDDEN, generator=g),
        torch.randn(width, HIDDEN, generator=g) * HIDDEN**-0.5,
        torch.randn(width, HIDDEN, generator=g) * HIDDEN**-0.5,
        torch.randn(ratio, width, generator=g),
        torch.randn(3, ring, 2, width, generator=g),
        torch.tensor(positions, dtype=torch.int32),
        torch.tensor(seq_ids, dtype=torch.int32),
        torch.tensor([2, 0], dtype=torch.int32),  # ring slots
        torch.tensor([5, 0], dtype=torch.int32),  # seq_start
    ]


@pytest.mark.parametrize(
    ("ratio", "overlap"), [(4, True), (4, False), (8, False)], ids=["csa", "hca4", "hca8"]
)
def test_the_cuda_rule_matches_the_cpu_rule(ratio: int, overlap: bool) -> None:
    p = WindowCompressParams(ratio=ratio, overlap=overlap)
    args = _operands(ratio, overlap)
    want = rules_window.window_compress_into(p, *[a.clone() for a in args])
    device = on_device(args)
    got = cuda_cache.window_compress(p, *device)
    latent, closes, state = (t.cpu() for t in got)
    assert got[2].data_ptr() == device[4].data_ptr()  # the ring is written in place
    assert torch.equal(closes, want[1]) and bool(closes.any())
    torch.testing.assert_close(latent, want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want[2], rtol=1e-5, atol=1e-5)
    assert bool((latent[~closes] == 0).all())


def test_unchecked_gives_the_checked_bits() -> None:
    p = WindowCompressParams(ratio=4, overlap=True)
    args = _operands(4, True)
    checked = cuda_cache.window_compress(p, *on_device([a.clone() for a in args]))
    with unchecked():
        free = cuda_cache.window_compress(p, *on_device([a.clone() for a in args]))
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(checked, free, strict=True))


def test_the_cuda_platform_runs_this_rule() -> None:
    from dsgraph.platform.cuda.target import PLATFORM

    assert PLATFORM.rules["window_compress"] is cuda_cache.window_compress
