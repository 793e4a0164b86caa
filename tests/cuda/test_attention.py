"""The cuda `attention` rule (Triton, platform/cuda/kernels/attention.py) against the cpu rule.

On a CUDA machine the kernels run on the GPU; elsewhere under Triton's interpreter (TRITON_INTERPRET=1,
set before triton is imported) on tiny shapes. The cpu reference always runs on CPU copies.

Tolerances (values are O(1); keys are FP8/NVFP4 values, exact in bf16): f32 queries use IEEE f32 dots,
so only the order of f32 sums and exp's last bits differ: 2e-5 absolute and relative. bf16 queries meet
the probabilities rounded to bf16 in the P.V dot (relative 2^-9 per term, so at most 2^-9 * max|key| on
an output) and the output is rounded to bf16 (one step of 2^-8 relative either way): atol
2^-8 * max|key|, rtol 2^-7.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.ops.attention import AttentionParams  # noqa: E402
from dsgraph.platform.cpu.cache_format import fp8_g32_encode, nvfp4_g16_encode  # noqa: E402
from dsgraph.platform.cpu.quant import fp8_g32_qdq  # noqa: E402
from dsgraph.platform.cpu.rules_attention import attention as cpu_attention  # noqa: E402
from dsgraph.platform.cuda.kernels import attention as cuda_attention  # noqa: E402
from tests.cuda.kernel_env import on_device  # noqa: E402

I32 = torch.int32

# (rows in this step, position of the first row = seq_start, seq_window_start) per sequence: a chunk that
# reads the ring, a decode row whose window is cut by seq_window_start, a prompt starting at 0.
TINY_SEQS = [(3, 10, 0), (1, 20, 15), (2, 0, 0)]


def _step(
    seqs: list[tuple[int, int, int]], heads: int, width: int, window: int, topk: int, dtype: torch.dtype,
    seed: int, block_size: int = 4, table_width: int = 6, pad: int = 1,
) -> tuple[AttentionParams, list[torch.Tensor]]:  # fmt: skip
    """Operands of one step (12 of them) on CPU: `pad` padding rows last; topk picks distinct entries of
    allocated blocks (the last table column is unallocated), a duplicate, and -1 in the last slot."""
    g = torch.Generator().manual_seed(seed)
    rows, num_seqs = sum(n for n, _, _ in seqs) + pad, len(seqs)
    positions = [p0 + i for n, p0, _ in seqs for i in range(n)] + [0] * pad
    seq_ids = [s for s, (n, _, _) in enumerate(seqs) for _ in range(n)] + [-1] * pad
    q = torch.randn(rows, heads, width, generator=g).to(dtype)
    kv = fp8_g32_qdq(torch.randn(rows, width, generator=g)).to(dtype)
    ring_len = window + 4
    ring = fp8_g32_encode(torch.randn(num_seqs + 1, ring_len, width, generator=g))
    sink = torch.randn(heads, generator=g)
    num_blocks = num_seqs * table_width + 2
    pool = nvfp4_g16_encode(torch.randn(num_blocks, block_size, width, generator=g))
    table = torch.randperm(num_blocks, generator=g)[: num_seqs * table_width].view(num_seqs, -1).to(I32)
    table[:, -1] = -1
    selected = torch.full((rows, topk), -1, dtype=I32)
    allocated = (table_width - 1) * block_size
    for t in range(rows - pad):
        chosen = torch.randperm(allocated, generator=g)[: topk - 2].sort().values
        picks = torch.cat((chosen, chosen[:1])).to(I32)
        selected[t, : picks.numel()] = picks
    step = [
        torch.tensor(positions, dtype=I32),
        torch.tensor(seq_ids, dtype=I32),
        torch.arange(1, num_seqs + 1, dtype=I32),  # ring slot 0 belongs to no sequence
        torch.tensor([p0 for _, p0, _ in seqs], dtype=I32),
        torch.tensor([first for _, _, first in seqs], dtype=I32),
    ]
    params = AttentionParams(window=window, softmax_scale=width**-0.5)
    return params, [q, kv, ring, sink, *step, pool, table, selected]


def _assert_close(got: torch.Tensor, want: torch.Tensor, key_max: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=2e-5)
    else:
        torch.testing.assert_close(got.cpu().float(), want.float(), atol=2**-8 * key_max, rtol=2**-7)


# Several splits even on tiny shapes.
SMALL = replace(cuda_attention.TILES, split_tiles=1, block_n=16)
ATTENTION = cuda_attention.attention  # the rule; a test binds a tiling to it


@pytest.mark.parametrize("split", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("with_pool", [True, False], ids=["swa+pool", "swa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_attention_matches_the_cpu_rule(dtype: torch.dtype, with_pool: bool, split: bool) -> None:
    p, args = _step(TINY_SEQS, heads=4, width=64, window=8, topk=20, dtype=dtype, seed=1)
    args = args if with_pool else args[:9]
    want = cpu_attention(p, *args)
    got = cuda_attention.launch(
        p, *on_device(args[:4]), tuple(on_device(args[4:])), split=split, tiling=SMALL
    )
    _assert_close(got, want, key_max=4.0)
    assert not got[-1].any(), "a padding row must give zeros"


@pytest.mark.parametrize("block_h", [16, 32], ids=["two-head-blocks-of-16", "one-of-32"])
def test_the_tiles_match_the_cpu_rule_on_both_paths(block_h: int) -> None:
    """The default tiles with keys cut into tiles of 16 and at most 2 tiles a split: a window of 40 (3 SWA
    tiles) spans two SWA splits, the second partial, then 3 pool tiles; 20 heads give two head blocks of
    16 (as f32 queries and heads <= 16 run) or one of 32 (padded)."""
    tiling = replace(cuda_attention.TILES, block_h=block_h, block_n=16, split_tiles=2)
    p, args = _step(TINY_SEQS, heads=20, width=32, window=40, topk=40, dtype=torch.bfloat16, seed=6,
                    table_width=12)  # fmt: skip
    want = cpu_attention(p, *args)
    device_args = on_device(args)
    decode = cuda_attention.launch(p, *device_args[:4], tuple(device_args[4:]), split=True, tiling=tiling)
    prefill = cuda_attention.launch(p, *device_args[:4], tuple(device_args[4:]), split=False, tiling=tiling)
    _assert_close(decode, want, key_max=4.0)
    assert torch.equal(decode, prefill), "the decode and prefill paths must give the same bits"


def test_the_rule_picks_a_path_and_gives_the_same_values() -> None:
    """Default tiles; 20 heads (two head blocks) and a head dim that is no power of two (96: the
    per-column decoders instead of the per-group ones)."""
    p, args = _step(
        TINY_SEQS, heads=20, width=96, window=8, topk=40, dtype=torch.float32, seed=2, table_width=12
    )
    want = cpu_attention(p, *args)
    got = cuda_attention.attention(p, *on_device(args))
    _assert_close(got, want, key_max=4.0)


@pytest.mark.parametrize("seed", range(4))
def test_sampled_shapes_match_the_cpu_rule(seed: int) -> None:
    """Heads, head dim, window, top-k width, sequences and dtype drawn from `seed`; both paths."""
    g = torch.Generator().manual_seed(100 + seed)

    def draw(*choices: int) -> int:
        return choices[int(torch.randint(len(choices), (1,), generator=g))]

    seqs = []
    for _ in range(draw(1, 2, 3)):
        start = draw(0, 3, 9, 30)
        seqs.append((draw(1, 2, 4), start, draw(0, start // 2, start)))
    heads, width, window, topk = draw(1, 3, 16, 17), draw(32, 64, 96), draw(1, 5, 8, 20), draw(2, 7, 19)
    dtype = (torch.float32, torch.bfloat16)[seed % 2]
    p, args = _step(seqs, heads, width, window, topk, dtype, seed=seed, table_width=8, pad=seed % 2)
    want = cpu_attention(p, *args)
    for split in (True, False):
        got = cuda_attention.launch(p, *on_device(args[:4]), tuple(on_device(args[4:])), split=split)
        _assert_close(got, want, key_max=4.0)


def _row_of_a_batch(p: AttentionParams, args: list[torch.Tensor], rows: slice) -> torch.Tensor:
    return cuda_attention.attention(p, *on_device(args)).cpu()[rows]


def test_a_sequence_gives_the_same_bits_alone_and_in_a_batch_of_7(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode path alone, prefill path in the batch (decode_max_rows lowered): bit-identical rows."""
    tiling = replace(cuda_attention.TILES, decode_max_rows=4, split_tiles=1)
    monkeypatch.setattr(cuda_attention, "attention", functools.partial(ATTENTION, tiling=tiling))
    seqs = [(2, 30, 0), (1, 9, 0), (3, 14, 2), (1, 40, 35), (2, 5, 0), (1, 17, 0), (1, 3, 0)]
    p, batch = _step(seqs, heads=4, width=32, window=8, topk=12, dtype=torch.bfloat16, seed=3)
    # Sequence 2 alone: its rows (as sequence 0), its per-sequence values and block table row, no padding.
    rows = slice(3, 6)
    alone = list(batch)
    for i in (0, 1, 4, 11):  # q, kv, positions, topk
        alone[i] = batch[i][rows]
    alone[5] = torch.zeros(3, dtype=I32)
    for i in (6, 7, 8, 10):  # seq_slot, seq_start, seq_window_start, block_table
        alone[i] = batch[i][2:3]
    assert alone[0].shape[0] <= tiling.decode_max_rows < batch[0].shape[0]
    by_itself = cuda_attention.attention(p, *on_device(alone)).cpu()
    assert torch.equal(by_itself, _row_of_a_batch(p, batch, rows))
    _assert_close(by_itself, cpu_attention(p, *alone), key_max=4.0)


def _bad(args: list[torch.Tensor], index: int, value: torch.Tensor) -> list[torch.Tensor]:
    return [value if i == index else a for i, a in enumerate(args)]


@pytest.mark.parametrize(
    ("index", "edit", "match"),
    [
        (5, lambda t: t.index_fill(0, torch.tensor([0]), 7), "row 0 has seq_id 7"),
        (6, lambda t: t.index_fill(0, torch.tensor([1]), 9), r"ring slot of row\[3\] is 9"),
        (4, lambda t: t.index_fill(0, torch.tensor([1]), 30), "rows must be contiguous"),
        (11, lambda t: t.index_fill(1, torch.tensor([2]), 22), "needs entry 22, in block -1"),
    ],
    ids=["seq_id", "ring_slot", "contiguous", "unallocated"],
)
def test_the_rule_raises_the_cpu_rule_errors(index: int, edit, match: str) -> None:  # type: ignore[no-untyped-def]
    p, args = _step(TINY_SEQS, heads=4, width=32, window=8, topk=6, dtype=torch.float32, seed=4)
    bad = _bad(args, index, edit(args[index].clone()))
    with pytest.raises((IndexError, ValueError), match=match):
        cpu_attention(p, *bad)
    with pytest.raises((IndexError, ValueError), match=match):
        cuda_attention.attention(p, *on_device(bad))


@pytest.mark.gpu
@pytest.mark.parametrize(("num_seqs", "rows_per_seq"), [(8, 1), (4, 3)], ids=["decode", "chunks"])
def test_real_widths_against_the_cpu_rule(num_seqs: int, rows_per_seq: int) -> None:
    """64 heads x 512, window 128, top-k 512 over contexts of a few thousand tokens (bf16 queries), the
    rule's tiles."""
    tiling = cuda_attention.TILES
    seqs = [(rows_per_seq, 1000 + 700 * s, 200 * (s % 2)) for s in range(num_seqs)]
    p, args = _step(seqs, heads=64, width=512, window=128, topk=512, dtype=torch.bfloat16, seed=5,
                    block_size=64, table_width=100)  # fmt: skip
    want = cpu_attention(p, *args)
    device_args = on_device(args)
    decode = cuda_attention.launch(p, *device_args[:4], tuple(device_args[4:]), split=True, tiling=tiling)
    prefill = cuda_attention.launch(p, *device_args[:4], tuple(device_args[4:]), split=False, tiling=tiling)
    _assert_close(decode, want, key_max=8.0)
    assert torch.equal(decode, prefill), "the decode and prefill paths must give the same bits"


@pytest.mark.gpu
def test_the_ptx_key_decode_gives_the_plain_decodes_bits() -> None:
    """The pool's NVFP4 keys decoded by PTX in BF16 (TILES.key_ptx) and in f32 then rounded (key_ptx off):
    every code with every finite E4M3 scale byte (subnormal scales and 448 included) gives the same
    outputs bit for bit, on both paths."""
    seqs = [(1, 1000 + 700 * s, 0) for s in range(6)] + [(3, 2500, 100)]
    p, args = _step(seqs, heads=64, width=512, window=128, topk=512, dtype=torch.bfloat16, seed=9,
                    block_size=64, table_width=100)  # fmt: skip
    g = torch.Generator().manual_seed(3)
    pool = args[9]
    pool[..., :256] = torch.randint(0, 256, pool[..., :256].shape, generator=g, dtype=torch.uint8)
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    pool[..., 256:] = finite[torch.randint(0, finite.numel(), pool[..., 256:].shape, generator=g)]
    device_args = on_device(args)
    plain = replace(cuda_attention.TILES, key_ptx=False)
    for split in (True, False):
        outs = [
            cuda_attention.launch(p, *device_args[:4], tuple(device_args[4:]), split=split, tiling=t)
            for t in (cuda_attention.TILES, plain)
        ]
        assert torch.isfinite(outs[1].float()).all()
        assert torch.equal(outs[0], outs[1]), f"split={split}: the PTX decode changed the bits"


def test_the_cuda_platform_runs_this_rule() -> None:
    from dsgraph.platform.cuda.target import PLATFORM

    assert PLATFORM.rules["attention"] is cuda_attention.attention


@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None, reason="no NVIDIA backend")
def test_the_pool_tile_loop_stays_within_its_instruction_budget() -> None:
    """The split kernel's pool-tile loop in sm_90 SASS (attn_sweep --static, no GPU): 2,138 instructions a
    tile of 32 keys x 32 heads at 002f633, 3,982 before the PTX key decode (3,442 with it pure, when the
    compiler decoded each tile twice). A change that brings the second decode or the per-key division
    back fails here before a GPU shows it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json, sys; from dsgraph.tools.bench import attn_sweep as S; "
        "r = S.static(['current'])['current']; print(json.dumps(r['split_kernel']['loops'][-1]))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    loop = json.loads(done.stdout.strip().splitlines()[-1])
    assert loop["instructions"] <= 2300, loop
    assert loop["int_div"] == 0 and loop["spill_loads"] <= 4, loop


@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None, reason="no NVIDIA backend")
def test_the_kernels_compile_for_hopper() -> None:
    """The interpreter accepts code the compiler refuses: compile every kernel of attention, indexer and
    cache writes for sm_90 (no GPU needed) in a subprocess without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("hopper_compile.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
