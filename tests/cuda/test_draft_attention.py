"""The cuda `draft_attention` rule (the attention kernels' draft-block mode, platform/cuda/kernels/
attention.py) against the cpu rule (platform/cpu/rules_dspark.py), on the runtime's draft layout (blocks
of block_size rows at positions a, a+1, ..), and the fall back to the cpu rule on any other layout.

On a CUDA machine the kernels run on the GPU; elsewhere under Triton's interpreter on tiny shapes.
Tolerances: those of tests/cuda/test_attention.py (the same kernels and sums)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.ops.dspark import DraftAttentionParams  # noqa: E402
from dsgraph.platform.cpu.cache_format import fp8_g32_encode  # noqa: E402
from dsgraph.platform.cpu.quant import fp8_g32_qdq  # noqa: E402
from dsgraph.platform.cpu.rules_dspark import draft_attention as cpu_draft  # noqa: E402
from dsgraph.platform.cuda.kernels import attention as cuda_attention  # noqa: E402
from tests.cuda.kernel_env import on_device  # noqa: E402
from tests.cuda.test_attention import _assert_close  # noqa: E402

I32 = torch.int32
SMALL = replace(cuda_attention.TILES, split_tiles=1, block_n=16)  # several splits on tiny shapes


def _draft_step(
    anchors: list[tuple[int, int]], pad_seqs: int, block: int, heads: int, width: int, window: int,
    dtype: torch.dtype, seed: int,
) -> tuple[DraftAttentionParams, list[torch.Tensor]]:  # fmt: skip
    """Operands of one draft pass: per sequence (anchor position a, seq_window_start) its `block` rows at
    positions a .. a+block-1 (dspark_io.draft_inputs' layout), then `pad_seqs` padding sequences."""
    g = torch.Generator().manual_seed(seed)
    seqs = len(anchors) + pad_seqs
    rows = seqs * block
    starts = [a for a, _ in anchors] + [0] * pad_seqs
    positions = [starts[s] + j for s in range(seqs) for j in range(block)]
    seq_ids = [s if s < len(anchors) else -1 for s in range(seqs) for _ in range(block)]
    q = torch.randn(rows, heads, width, generator=g).to(dtype)
    kv = fp8_g32_qdq(torch.randn(rows, width, generator=g)).to(dtype)
    ring = fp8_g32_encode(torch.randn(seqs + 1, window + 3, width, generator=g))
    step = [
        torch.tensor(positions, dtype=I32),
        torch.tensor(seq_ids, dtype=I32),
        torch.tensor([(s + 1) % (seqs + 1) for s in range(seqs)], dtype=I32),
        torch.tensor(starts, dtype=I32),
        torch.tensor([f for _, f in anchors] + [0] * pad_seqs, dtype=I32),
    ]
    p = DraftAttentionParams(window=window, softmax_scale=width**-0.5, block_size=block)
    return p, [q, kv, ring, torch.randn(heads, generator=g), *step]


# a context that wraps the ring, one cut by seq_window_start, one shorter than the window (a < window)
ANCHORS = [(40, 0), (25, 20), (3, 0)]


@pytest.mark.parametrize("split", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_draft_mode_matches_the_cpu_rule(
    dtype: torch.dtype, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, args = _draft_step(ANCHORS, pad_seqs=1, block=5, heads=4, width=64, window=8, dtype=dtype, seed=1)
    want = cpu_draft(p, *args)
    monkeypatch.setattr(cuda_attention.rules_dspark, "draft_attention", None)  # the kernels must run
    tiling = replace(SMALL, decode_max_rows=1 << 20 if split else 0)
    got = cuda_attention.draft_attention(p, *on_device(args), tiling=tiling)
    _assert_close(got, want, key_max=8.0)
    assert bool((got.cpu()[-5:] == 0).all()), "padding rows give zeros"


def test_every_row_of_a_block_sees_the_same_keys() -> None:
    """A block's rows differ only in their queries: equal queries give equal outputs (the last row's keys
    serve them all, later rows included)."""
    p, args = _draft_step([(30, 0)], pad_seqs=0, block=5, heads=4, width=64, window=8,
                          dtype=torch.float32, seed=2)  # fmt: skip
    args[0] = args[0][:1].expand(5, -1, -1).contiguous()
    got = cuda_attention.draft_attention(p, *on_device(args), tiling=SMALL).cpu()
    assert all(torch.equal(got[0], got[i]) for i in range(1, 5))
    torch.testing.assert_close(got, cpu_draft(p, *args), atol=2e-5, rtol=2e-5)


def test_other_layouts_run_the_cpu_rule() -> None:
    """Blocks shorter than block_size, or positions that are not a, a+1, ..: the checked rule gives the
    cpu rule's values exactly (the kernels' draft mode assumes the runtime's layout)."""
    p, args = _draft_step(ANCHORS, pad_seqs=0, block=5, heads=4, width=64, window=8,
                          dtype=torch.float32, seed=3)  # fmt: skip
    shorter = replace(p, block_size=6)  # every block one row short of block_size
    shuffled = list(args)
    shuffled[4] = args[4].flip(0)  # positions no longer follow the rows
    for params, operands in ((shorter, args), (p, shuffled)):
        # the cpu rule on the same device (a GPU's f32 sums round differently from the host's)
        want = cpu_draft(params, *on_device(operands)).cpu()
        assert torch.equal(cuda_attention.draft_attention(params, *on_device(operands)).cpu(), want)


def test_the_cuda_platform_runs_this_rule() -> None:
    from dsgraph.platform.cuda.target import PLATFORM

    assert PLATFORM.rules["draft_attention"] is cuda_attention.draft_attention
