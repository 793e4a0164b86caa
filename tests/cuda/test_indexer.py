"""The cuda `index_scores` (Triton), `candidate_mask` and `topk_select` rules
(platform/cuda/kernels/indexer.py) against the cpu rules.

On a CUDA machine the kernels run on the GPU; elsewhere under Triton's interpreter (TRITON_INTERPRET=1,
set before triton is imported) on tiny shapes. The cpu reference always runs on CPU copies.

Tolerances: keys are MXFP4 values (exact in bf16) and bf16 queries meet them in bf16 dots with exact
products, f32 queries in IEEE f32 dots; only the order of the f32 sums differs, so |got - want| <=
2^-18 * abs_sum with abs_sum = sum_h |w_h| sum_d |q_hd k_d|, and -inf exactly where the cpu rule has it.
candidate_mask and topk_select are exact: the same entries in the same order.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.platform.cpu import rules_attention as cpu  # noqa: E402
from dsgraph.platform.cpu.cache_format import mxfp4_g32_decode, mxfp4_g32_encode  # noqa: E402
from dsgraph.platform.cpu.quant import mxfp4_g32_qdq  # noqa: E402
from dsgraph.platform.cuda.kernels import indexer  # noqa: E402
from tests.cuda.kernel_env import DEVICE, on_device  # noqa: E402

I32 = torch.int32
NEG_INF = float("-inf")


def _index_step(
    positions: list[int], seq_ids: list[int], heads: int, width: int, block_size: int, table_width: int,
    dtype: torch.dtype, seed: int,
) -> list[torch.Tensor]:  # fmt: skip
    """(q, w, keys, block_table, positions, seq_ids) on CPU; each sequence's table has an unallocated
    block in the middle, and the pool has one block more than the tables use."""
    g = torch.Generator().manual_seed(seed)
    rows, num_seqs = len(positions), max(seq_ids) + 1
    q = mxfp4_g32_qdq(torch.randn(rows, heads, width, generator=g)).to(dtype)
    w = torch.randn(rows, heads, generator=g)
    num_blocks = num_seqs * table_width + 1
    keys = mxfp4_g32_encode(torch.randn(num_blocks, block_size, width, generator=g))
    table = torch.randperm(num_blocks, generator=g)[: num_seqs * table_width].view(num_seqs, -1).to(I32)
    table[:, table_width // 2] = -1
    return [q, w, keys, table, torch.tensor(positions, dtype=I32), torch.tensor(seq_ids, dtype=I32)]


def _abs_sum(args: list[torch.Tensor]) -> torch.Tensor:
    """sum_h |w| sum_d |q k| of every (row, entry), through the cpu rule with |q| and |keys|."""
    q, w, keys, *rest = args
    magnitude = mxfp4_g32_encode(mxfp4_g32_decode(keys).abs())
    return cpu.index_scores(
        SimpleNamespace(ratio=1, key_fmt="mxfp4_g32"), q.float().abs(), w.abs(), magnitude, *rest
    )


def _assert_scores(got: torch.Tensor, want: torch.Tensor, abs_sum: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    got = got.cpu()
    assert torch.equal(got == NEG_INF, want == NEG_INF), "-inf entries differ"
    finite = want > NEG_INF
    err = (got - want).abs()[finite]
    assert bool((err <= 2.0**-18 * abs_sum[finite] + 1e-30).all()), float(err.max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_index_scores_match_the_cpu_rule(ratio: int, dtype: torch.dtype) -> None:
    positions, seq_ids = [3, 4, 5, 0, 40, 9, 0], [0, 0, 0, 1, 2, 2, -1]
    args = _index_step(
        positions, seq_ids, heads=5, width=64, block_size=4, table_width=5, dtype=dtype, seed=1
    )
    p = SimpleNamespace(ratio=ratio, key_fmt="mxfp4_g32")
    want = cpu.index_scores(p, *args)
    got = indexer.index_scores(p, *on_device(args))
    _assert_scores(got, want, _abs_sum(args))
    assert bool((want[-1] == NEG_INF).all()) and bool((want[0] > NEG_INF).any())


def test_bf16_head_weights_are_read_as_their_f32_values() -> None:
    """The model hands index_scores its BF16 head weights (no cast launch): the scores are those of the
    same weights as f32, bit for bit, on both platforms."""
    positions, seq_ids = [3, 4, 5, 0, 40, 9, 0], [0, 0, 0, 1, 2, 2, -1]
    args = _index_step(
        positions, seq_ids, heads=5, width=64, block_size=4, table_width=5, dtype=torch.bfloat16, seed=3
    )
    args[1] = args[1].to(torch.bfloat16)
    as_f32 = [args[0], args[1].float(), *args[2:]]
    p = SimpleNamespace(ratio=2, key_fmt="mxfp4_g32")
    assert torch.equal(cpu.index_scores(p, *args), cpu.index_scores(p, *as_f32))
    got = indexer.index_scores(p, *on_device(args)).cpu()
    assert torch.equal(got, indexer.index_scores(p, *on_device(as_f32)).cpu())
    assert bool((got[0] > NEG_INF).any())


@pytest.mark.parametrize("ratio", [1, 2])
def test_index_scores_skip_entry_blocks_past_the_causal_limit(ratio: int) -> None:
    """A table of 160 entries (three programs of 64 per row): rows whose limit ends inside the first,
    second or last block of entries, and one before any entry; skipped blocks are -inf like the rule's."""
    positions, seq_ids = [0, 3, 70, 150, 159, 129], [0, 0, 1, 1, 1, 0]
    args = _index_step(
        positions, seq_ids, heads=4, width=32, block_size=4, table_width=40, dtype=torch.bfloat16, seed=4
    )
    p = SimpleNamespace(ratio=ratio, key_fmt="mxfp4_g32")
    want = cpu.index_scores(p, *args)
    _assert_scores(indexer.index_scores(p, *on_device(args)), want, _abs_sum(args))
    assert bool((want[:2, 64:] == NEG_INF).all())  # rows whose later programs are skipped
    assert bool((want[4, 128:] > NEG_INF).any()) == (ratio == 1)  # the last block seen at ratio 1


def test_index_scores_of_a_row_are_the_same_bits_alone_and_in_a_batch() -> None:
    positions, seq_ids = [7, 8, 30, 2, 3, 4, 11], [0, 0, 1, 2, 2, 2, 3]
    args = _index_step(
        positions, seq_ids, heads=4, width=32, block_size=4, table_width=6, dtype=torch.bfloat16, seed=2
    )
    batch = indexer.index_scores(SimpleNamespace(ratio=2, key_fmt="mxfp4_g32"), *on_device(args)).cpu()
    q, w, keys, table, pos, _ = args
    alone = [q[2:3], w[2:3], keys, table[1:2], pos[2:3], torch.zeros(1, dtype=I32)]
    by_itself = indexer.index_scores(SimpleNamespace(ratio=2, key_fmt="mxfp4_g32"), *on_device(alone)).cpu()
    assert torch.equal(by_itself, batch[2:3])


def test_index_scores_raise_the_cpu_rule_error_for_a_block_past_the_pool() -> None:
    args = _index_step(
        [5, 6], [0, 0], heads=4, width=32, block_size=4, table_width=3, dtype=torch.float32, seed=3
    )
    args[3][0, 2] = 99
    match = r"row 0 \(sequence 0\) has block_table\[0, 2\] = 99, past the pool of 4 blocks"
    with pytest.raises(IndexError, match=match):
        cpu.index_scores(SimpleNamespace(ratio=1, key_fmt="mxfp4_g32"), *args)
    with pytest.raises(IndexError, match=match):
        indexer.index_scores(SimpleNamespace(ratio=1, key_fmt="mxfp4_g32"), *on_device(args))


def _tied_scores(rows: int, width: int, levels: int, seed: int) -> torch.Tensor:
    """Scores from a few levels (many ties), some -inf, a row of only -inf and a row of one visible entry."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (rows, width), generator=g).float()
    scores[torch.rand(rows, width, generator=g) < 0.3] = NEG_INF
    scores[0] = NEG_INF
    scores[1, 1:] = NEG_INF
    return scores


@pytest.mark.parametrize(("width", "k"), [(1, 1), (13, 4), (40, 7), (9, 20)])
@pytest.mark.parametrize("levels", [2, 5])
def test_topk_select_equals_the_cpu_rule(width: int, k: int, levels: int) -> None:
    scores = _tied_scores(6, width, levels, seed=width * 10 + levels)
    want = cpu.topk_select(SimpleNamespace(k=k), scores)
    got = indexer.topk_select(SimpleNamespace(k=k), scores.to(DEVICE))
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), want), (got, want)


@pytest.mark.parametrize(
    ("width", "block_size", "topk_blocks"), [(16, 2, 3), (13, 4, 2), (40, 8, 9), (7, 3, 1)]
)
def test_candidate_mask_equals_the_cpu_rule(width: int, block_size: int, topk_blocks: int) -> None:
    for levels in (2, 4):
        scores = _tied_scores(7, width, levels, seed=width + levels)
        p = SimpleNamespace(block_size=block_size, topk_blocks=topk_blocks)
        want = cpu.candidate_mask(p, scores)
        got = indexer.candidate_mask(p, scores.to(DEVICE))
        assert got.dtype == torch.bool and torch.equal(got.cpu(), want), (levels, got, want)


def _awkward_scores(rows: int, width: int, seed: int) -> torch.Tensor:
    """Scores with NaN, +-inf, -0 beside +0, subnormals, negatives and runs of equal values."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor([float("nan"), float("inf"), NEG_INF, -0.0, 0.0, 1e-40, -1e-40, -3.5, 2.0, 7.25])
    scores = pool[torch.randint(0, len(pool), (rows, width), generator=g)]
    noisy = torch.rand(rows, width, generator=g) < 0.5
    return torch.where(noisy, torch.randn(rows, width, generator=g), scores)


@pytest.mark.parametrize("tile", [16, 1024])
@pytest.mark.parametrize(("width", "k"), [(100, 9), (100, 60), (37, 37), (37, 64)])
def test_topk_select_over_tiles_and_special_values(
    monkeypatch: pytest.MonkeyPatch, tile: int, width: int, k: int
) -> None:
    """NaN ranks above every number and is not output, -0 ties +0, and ties across tiles of the kernel's
    row loop go to the lowest index, as in the cpu rule's sort (tile 16: several tiles per row)."""
    monkeypatch.setattr(indexer, "SELECT_BLOCK", tile)
    monkeypatch.setattr(indexer, "SELECT_MIN_BLOCK", min(tile, 1024))
    scores = _awkward_scores(5, width, seed=width + k)
    scores[0] = 2.0  # one value everywhere: the lowest k indices
    p = SimpleNamespace(k=k)
    got = indexer.topk_select(p, scores.to(DEVICE)).cpu()
    assert torch.equal(got, cpu.topk_select(p, scores)), (got, cpu.topk_select(p, scores))


@pytest.mark.parametrize("tile", [16, 1024])
@pytest.mark.parametrize(("width", "block_size", "topk_blocks"), [(100, 3, 5), (100, 8, 4), (64, 8, 8)])
def test_candidate_mask_over_tiles_and_special_values(
    monkeypatch: pytest.MonkeyPatch, tile: int, width: int, block_size: int, topk_blocks: int
) -> None:
    monkeypatch.setattr(indexer, "SELECT_BLOCK", tile)
    monkeypatch.setattr(indexer, "SELECT_MIN_BLOCK", min(tile, 1024))
    scores = _awkward_scores(6, width, seed=width * block_size)
    scores[1, -7:] = NEG_INF  # the newest visible entry is not the last one
    p = SimpleNamespace(block_size=block_size, topk_blocks=topk_blocks)
    got = indexer.candidate_mask(p, scores.to(DEVICE)).cpu()
    assert torch.equal(got, cpu.candidate_mask(p, scores)), (got, cpu.candidate_mask(p, scores))


@pytest.mark.gpu
def test_real_widths_against_the_cpu_rules() -> None:
    """32 index heads x 128, ratio 2 over contexts of a few thousand tokens, top-k 512, candidate blocks
    of 8 (keep 2048 of them at width 4096, 64 when fewer blocks exist)."""
    positions = [1500 + 900 * s for s in range(6)]
    args = _index_step(positions, list(range(6)), heads=32, width=128, block_size=64, table_width=64,
                       dtype=torch.bfloat16, seed=5)  # fmt: skip
    want = cpu.index_scores(SimpleNamespace(ratio=2, key_fmt="mxfp4_g32"), *args)
    got = indexer.index_scores(SimpleNamespace(ratio=2, key_fmt="mxfp4_g32"), *on_device(args))
    _assert_scores(got, want, _abs_sum(args))
    scores = want.round()  # integer-valued scores: ties across many entries and blocks
    for k, topk_blocks in ((512, 2048), (1024, 64)):
        assert torch.equal(indexer.topk_select(SimpleNamespace(k=k), scores.cuda()).cpu(),
                           cpu.topk_select(SimpleNamespace(k=k), scores))  # fmt: skip
        p = SimpleNamespace(block_size=8, topk_blocks=topk_blocks)
        assert torch.equal(indexer.candidate_mask(p, scores.cuda()).cpu(), cpu.candidate_mask(p, scores))


def test_the_cuda_platform_runs_these_rules() -> None:
    from dsgraph.platform.cuda.target import PLATFORM

    for op in ("index_scores", "candidate_mask", "topk_select"):
        assert PLATFORM.rules[op] is indexer.RULES[op], op


def test_row_blocks_give_the_unblocked_rules_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """candidate_mask cuts long steps into blocks of ROW_BLOCK rows (its block scores at 64k-token chunks):
    a last block shorter than the others included, the same results as the cpu rules."""
    monkeypatch.setattr(indexer, "ROW_BLOCK", 3)
    scores = _tied_scores(8, 40, 3, seed=11)
    p = SimpleNamespace(block_size=4, topk_blocks=3, k=7)
    assert torch.equal(indexer.topk_select(p, scores.to(DEVICE)).cpu(), cpu.topk_select(p, scores))
    assert torch.equal(indexer.candidate_mask(p, scores.to(DEVICE)).cpu(), cpu.candidate_mask(p, scores))


def test_newest_visible_entry_per_row() -> None:
    from dsgraph.platform.cpu.rules_attention import _newest

    visible = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert _newest(visible).tolist() == [2, -1, 3, 0]
    assert _newest(torch.zeros(2, 0, dtype=torch.bool)).tolist() == [-1, -1]
