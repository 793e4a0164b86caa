"""The Engram kernels (platform/cuda/kernels/engram.py) against the cpu rules, bit for bit (the gate:
within f32 rounding, its sums run in another order), and the
weight placement (platform/cuda/placement.py): on CUDA when present, else under Triton's interpreter
with ordinary CPU tensors standing in for pinned ones. The GPU-marked tests read real pinned host tables
through their device views (zero-copy) and check the placement Session does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from dsgraph.models.deepseek_v41.engram_hash import EngramSpec, engram_primes, table_rows
from dsgraph.ops.engram import EngramGateParams, EngramHashParams, GatherDequantRowsParams
from dsgraph.platform.cpu import rules_engram
from dsgraph.platform.cpu.step_rows import unchecked
from dsgraph.platform.cuda import placement
from tests.cuda.kernel_env import DEVICE, compare_rules

pytest.importorskip("triton")
from dsgraph.platform.cuda.kernels import engram as E  # noqa: E402  (needs triton)

EXACT = (0.0, 0.0)
NAN_CODES = (0x7F, 0xFF)


def _table(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 bytes (no NaN codes) and UE8M0 scales spanning the edge exponents 0, 1 and 254."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, width), generator=gen, dtype=torch.uint8)
    codes[(codes == 0x7F) | (codes == 0xFF)] = 0x7E
    scale = torch.randint(110, 140, (rows, width // 32), generator=gen, dtype=torch.uint8)
    scale[0, 0], scale[-1, -1], scale[rows // 2, 0] = 0, 254, 1
    return codes.view(torch.float8_e4m3fn), scale.view(torch.float8_e8m0fnu)


def _gate_args(tokens: int, streams: int, hidden: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, streams, hidden, generator=gen).to(dtype)
    kv = torch.randn(tokens, (streams + 1) * hidden, generator=gen)
    qw = (1 + 0.1 * torch.randn(streams, hidden, generator=gen)).to(dtype)
    kw = (1 + 0.1 * torch.randn(streams, hidden, generator=gen)).to(dtype)
    token_ids = torch.arange(tokens, dtype=torch.int32) + 3
    token_ids[1], token_ids[-1] = -1, 7  # padding, and the image token of the params below
    return [x, kv, qw, kw, token_ids]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("hidden", [96, 2304])  # one tile with a ragged end; several tiles
def test_engram_gate_kernel_matches_the_cpu_rule(dtype: torch.dtype, hidden: int) -> None:
    args = _gate_args(6, 4, hidden, dtype, seed=hidden)
    p = EngramGateParams(eps=1e-6, image_token_id=7)
    got, want = compare_rules("engram_gate", p, args)
    x = args[0].float()
    # padding and image rows pass through unchanged; the others moved
    assert torch.equal(got[0][1].cpu(), args[0][1]) and torch.equal(got[0][-1].cpu(), args[0][-1])
    assert not torch.equal(got[0][0].cpu().float(), x[0])


def test_engram_gate_kernel_carries_nan_and_masks_it_on_padding_rows() -> None:
    args = _gate_args(4, 2, 64, torch.float32, seed=5)
    args[1][0, 0] = args[1][1, 0] = float("nan")  # a NaN key: the gate is NaN, unless the row is masked
    p = EngramGateParams(eps=1e-6, image_token_id=-1)
    got = E.engram_gate(p, *(a.to(DEVICE) for a in args)).cpu()
    want = rules_engram.engram_gate(p, *args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert got[0, 0].isnan().all() and not got[0, 1:].isnan().any() and not got[1].isnan().any()


@pytest.mark.parametrize("out_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("width", [64, 256])
def test_gather_dequant_rows_is_bit_equal_to_the_cpu_rule(out_dtype: str, width: int) -> None:
    table, scale = _table(37, width, seed=width)
    rows = torch.tensor([[0, 36, 5], [18, 18, 1], [36, 0, 7], [2, 3, 4]], dtype=torch.int64)
    p = GatherDequantRowsParams(out_dtype=out_dtype)
    got, _ = compare_rules(
        "gather_dequant_rows", p, [table, scale, rows], cuda_rule=E.gather_dequant_rows, tol=EXACT
    )
    assert got[0].shape == (4, 3, width)


def test_gather_decodes_every_fp8_code_and_scale_edge() -> None:
    """All 256 E4M3 codes (NaN codes, subnormals, -0) times 2^(e-127) for e = 0, 1, 127, 254."""
    codes = torch.arange(256, dtype=torch.uint8).reshape(8, 32).repeat(4, 1)
    scale = torch.tensor([0] * 8 + [1] * 8 + [127] * 8 + [254] * 8, dtype=torch.uint8)[:, None]
    table, scale = codes.view(torch.float8_e4m3fn), scale.view(torch.float8_e8m0fnu)
    rows = torch.arange(32, dtype=torch.int64)
    p = GatherDequantRowsParams(out_dtype="f32")
    got = E.gather_dequant_rows(p, table.to(DEVICE), scale.to(DEVICE), rows.to(DEVICE)).cpu()
    want = rules_engram.gather_dequant_rows(p, table, scale, rows)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    numbers = ~torch.isnan(want)
    assert torch.equal(torch.signbit(got[numbers]), torch.signbit(want[numbers]))  # -0.0 stays negative
    assert int(torch.isnan(got).sum()) == 4 * len(NAN_CODES)  # one of each NaN code per scale


def test_gather_rejects_a_row_outside_the_table_and_unchecked_gives_zeros() -> None:
    table, scale = _table(5, 32, seed=1)
    rows = torch.tensor([1, 5], dtype=torch.int64)
    p = GatherDequantRowsParams(out_dtype="f32")
    args = (table.to(DEVICE), scale.to(DEVICE), rows.to(DEVICE))
    with pytest.raises(IndexError, match=r"rows\[1\] = 5 is outside the table \[0, 5\)"):
        E.gather_dequant_rows(p, *args)
    with unchecked():
        got = E.gather_dequant_rows(p, *args).cpu()
    assert torch.equal(got[1], torch.zeros(32)) and torch.equal(
        got[0], rules_engram.gather_dequant_rows(p, table, scale, rows[:1])[0]
    )


# two layers, 3 heads per order, orders 2..4, primes above 30
SPEC = EngramSpec((1, 2), 31, 3, 4, 40, tuple(table_rows((1, 2), 31, 3, 4)), 2)


def _hash_params(k: int, image_token_id: int) -> EngramHashParams:
    layer = engram_primes(SPEC)[k]
    return EngramHashParams(layer.primes, layer.offsets, layer.multipliers, 5, 4, image_token_id)


def _step(seed: int) -> list[torch.Tensor]:
    """Three sequences (a fresh prefill, a later chunk with lookback, a decode row after a -1 lookback
    slot) around padding rows; token 7 is the image token in one case."""
    rng = np.random.default_rng(seed)
    ids = [int(v) for v in rng.integers(0, 60, 16)]
    ids[3] = 7
    pos = [0, 1, 2, 3, 4, -5, 9, 10, 11, 12, 13, 14, -1, 6, -1, -1]
    sid = [0, 0, 0, 0, 0, -1, 1, 1, 1, 1, 1, 1, -1, 2, -1, -1]
    starts = [0, 9, 6]
    lookback = [[-1, -1, -1], [12, 7, 40], [33, -1, 8]]
    tensors = [ids, pos, sid, starts, lookback]
    token_map = rng.integers(0, 40, 60)
    return [torch.tensor(t, dtype=torch.int32) for t in tensors] + [
        torch.tensor(token_map, dtype=torch.int32)
    ]


@pytest.mark.parametrize("image_token_id", [-1, 7])
@pytest.mark.parametrize("k", [0, 1])
def test_engram_hash_kernel_is_bit_equal_to_the_cpu_rule(k: int, image_token_id: int) -> None:
    p = _hash_params(k, image_token_id)
    args = _step(seed=k)
    with unchecked():  # the kernel runs unchecked (captured steps); checked runs take the cpu rule
        got, want = compare_rules("engram_hash", p, args, cuda_rule=E.engram_hash, tol=EXACT)
    assert got[0].shape == (16, 9) and int(want[0][5].abs().sum()) == 0  # padding rows give 0
    assert bool((want[0][6:12] != 0).any())


def test_engram_hash_with_the_released_constants_stays_int64() -> None:
    """Layer 1 and 14 constants (multipliers ~2^46, primes ~1.6e7): a float anywhere changes rows."""
    real = EngramSpec((1, 14), 16_000_000, 8, 4, 99092, (384006168, 384016682), 2)
    for layer in engram_primes(real):
        p = EngramHashParams(layer.primes, layer.offsets, layer.multipliers, 99091, 4, -1)
        args = _step(seed=layer.layer_id)
        args[5] = torch.arange(60, dtype=torch.int32) * 1651 % 99092
        with unchecked():
            compare_rules("engram_hash", p, args, cuda_rule=E.engram_hash, tol=EXACT)


def test_placement_keeps_only_large_engram_tables_on_the_host() -> None:
    w = {
        "layers.1.engram.embed.weight": torch.zeros(64, 32, dtype=torch.uint8),
        "layers.1.engram.embed.scale": torch.zeros(64, 1, dtype=torch.uint8),
        "layers.1.engram.wkv.weight": torch.zeros(4096, dtype=torch.uint8),
        "embed.weight": torch.zeros(4096, dtype=torch.uint8),
    }
    assert placement.host_tables(w, min_bytes=2048) == {
        "layers.1.engram.embed.weight",
        "layers.1.engram.embed.scale",  # the scales follow their table's size
    }
    assert placement.host_tables(w, min_bytes=2049) == frozenset()
    assert placement.is_host_table("weights.layers.14.engram.embed.scale")
    assert not placement.is_host_table("layers.14.engram.embed.weight.x")
    cpu = placement.place_weights(w, torch.device("cpu"), min_bytes=0)  # host placement is cuda only
    assert all(cpu[k] is w[k] for k in w)


@pytest.mark.gpu
def test_pinned_host_table_is_read_zero_copy_by_the_kernel_and_the_cpu_rule() -> None:
    table, scale = _table(4096, 256, seed=3)
    host_t, host_s = placement.pin_in_place(table.clone()), placement.pin_in_place(scale.clone())
    assert host_t.is_pinned() and host_s.is_pinned()
    view_t, view_s = placement.device_view(host_t, DEVICE), placement.device_view(host_s, DEVICE)
    assert view_t.is_cuda and view_t.data_ptr() == host_t.data_ptr()  # an alias, not a copy
    assert placement.host_of(view_t) is host_t
    rows = torch.randint(0, 4096, (64, 24), dtype=torch.int64)
    p = GatherDequantRowsParams(out_dtype="bf16")
    want = rules_engram.gather_dequant_rows(p, table, scale, rows)
    for rule in (E.gather_dequant_rows, rules_engram.gather_dequant_rows):
        got = rule(p, view_t, view_s, rows.to(DEVICE))
        assert got.is_cuda and torch.equal(got.cpu(), want)
    # pinned CPU tensors handed to the kernel directly: Triton's launcher accepts the mapped host pointer
    assert torch.equal(E.gather_dequant_rows(p, host_t, host_s, rows.to(DEVICE)).cpu(), want)
    host_t[0].view(torch.uint8).fill_(0x38)  # writes on the host are seen by the device: same pages
    assert float(view_t[0, 0].float()) == 1.0


@pytest.mark.gpu
def test_session_places_large_engram_tables_in_pinned_host_memory(tmp_path: Any) -> None:
    from dsgraph.models.deepseek_v41.numerics import SERVING
    from dsgraph.runtime.engine_config import CudaConfig
    from dsgraph.runtime.session import Session
    from tests.oracle import model_fixtures as fx

    runner = fx.runner(fx.checkpoint("tiny", str(tmp_path)), SERVING)
    weights = dict(runner.session.weights)
    weights = {k.removeprefix("weights."): v for k, v in weights.items()}
    sizes = runner.session.cache_sizes
    host = Session(
        runner.model, weights, sizes, platform="cuda", device="cuda", cuda=CudaConfig(engram_host_min_bytes=0)
    )
    tables = [k for k in host.weights if placement.is_host_table(k)]
    assert tables, "the tiny model has Engram tables"
    for name, t in host.weights.items():
        assert t.is_cuda, name
        assert (placement.host_of(t) is not None) == (name in tables), name
    device = Session(runner.model, weights, sizes, platform="cuda", device="cuda")
    assert all(placement.host_of(t) is None for t in device.weights.values())
