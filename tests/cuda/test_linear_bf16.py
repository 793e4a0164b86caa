"""The FP8-weight kernels of the cuda `linear` (linear_bf16_tl.py: exact bf16 operands, one chained FP32
accumulator), swapped and plain, against the cpu rule within test_linear.py's bounds, and bit-equal
across tiles and kernels."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.platform.cuda.kernels import linear as cuda_linear  # noqa: E402
from tests.cuda.kernel_env import DEVICE, ON_GPU  # noqa: E402
from tests.cuda.test_linear import _compare_linear, _params, _weight  # noqa: E402

Tiles = cuda_linear.Tiles
PATH_TILES = [Tiles(16, 64, 128, 4, 4, True), Tiles(128, 64, 64, 8, 3), Tiles(64, 64, 32, 4, 3),
              Tiles(16, 64, 128, 4, 4, True, True)]  # fmt: skip


@pytest.mark.parametrize("tiles", PATH_TILES, ids=lambda t: "-".join(map(str, t)))
@pytest.mark.parametrize(("act_quant", "x_dtype"), [("fp8_g32", torch.bfloat16), ("none", torch.bfloat16),
                                                    ("none", torch.float16)], ids=str)  # fmt: skip
# (5, 96, 192): a partial K step for block_k 128; (70, 130, 256): partial M and N tiles (GPU only)
@pytest.mark.parametrize("shape", [(5, 96, 192)] + ([(70, 130, 256)] if ON_GPU else []), ids=str)
def test_bf16_path_matches_cpu_rule(tiles: Tiles, act_quant: str, x_dtype: torch.dtype, shape: tuple) -> None:
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 100 + n + k)
    x = (torch.randn(m, k, generator=gen) * 3).to(x_dtype)
    w = _weight("fp8_block32", n, k, x_dtype, gen)
    p = _params("fp8_block32", act_quant, "bf16")
    ref = cuda_linear.linear(p, x.to(DEVICE), *(t.to(DEVICE) for t in w), tiles=tiles)
    assert ref.shape == (m, n)
    _compare_linear_tiles(p, x, w, tiles)


def _compare_linear_tiles(p, x, w, tiles: Tiles) -> None:
    """test_linear._compare_linear with the given tiles (its rule call takes the table's)."""
    original = cuda_linear.tiles_for
    cuda_linear.tiles_for = lambda m, dense=False: tiles
    try:
        _compare_linear(p, x, w)
    finally:
        cuda_linear.tiles_for = original


@pytest.mark.gpu
@pytest.mark.parametrize("nk", [(2304, 5120), (5120, 8192), (32768, 1280)], ids=str)
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_bf16_rows_bit_equal_across_tiles_on_gpu(nk: tuple[int, int], x_dtype: torch.dtype) -> None:
    """The same rows in batches of 1 .. 300 give the same bits under every tile set, swapped (weight
    dequantized in registers, activations quantized in the GEMM) or not (both prepared before it)."""
    gen = torch.Generator().manual_seed(23)
    x = (torch.randn(300, nk[1], generator=gen) * 2).to(x_dtype).to(DEVICE)
    w = tuple(t.to(DEVICE) for t in _weight("fp8_block32", *nk, torch.bfloat16, gen))
    # bf16 x: FP8-g32 activations (quantized in the swapped GEMM or by the pass before the plain one);
    # f32 x: wo_b's split into three bf16 pieces
    p = _params("fp8_block32", "fp8_g32" if x_dtype == torch.bfloat16 else "none", "bf16")
    full = cuda_linear.linear(p, x, *w, tiles=Tiles(128, 128, 64, 8, 3))
    wide = (Tiles(16, 128, 128, 8, 2, True, True), Tiles(16, 64, 256, 4, 1, True, True),
            Tiles(64, 128, 128, 8, 3, True, True))  # fmt: skip
    for tiles in (*PATH_TILES, Tiles(128, 256, 64, 8, 3), Tiles(16, 128, 64, 8, 4, True), *wide):
        for size in (1, 16, 65, 300):
            part = cuda_linear.linear(p, x[:size], *w, tiles=tiles)
            diff = (part != full[:size]).sum().item()
            assert diff == 0, f"batch {size}, tiles {tiles}: {diff} elements differ"


@pytest.mark.parametrize("act_quant", ["fp8_g32", "none"])
def test_wide_steps_give_the_chunked_bits(act_quant: str) -> None:
    """A swapped tile that loads and dequantizes its whole BLOCK_K step at once gives the bits of the one
    that works 32 columns at a time (K = 320: two full steps of 128 and a partial one; a partial M and N
    tile)."""
    gen = torch.Generator().manual_seed(31)
    x = (torch.randn(5, 320, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    w = tuple(t.to(DEVICE) for t in _weight("fp8_block32", 96, 320, torch.bfloat16, gen))
    p = _params("fp8_block32", act_quant, "bf16")
    chunked = cuda_linear.linear(p, x, *w, tiles=Tiles(16, 64, 128, 4, 2, True))
    wide = cuda_linear.linear(p, x, *w, tiles=Tiles(16, 64, 128, 4, 2, True, True))
    assert chunked.abs().max() > 0
    assert torch.equal(wide, chunked), (wide != chunked).sum().item()


@pytest.mark.parametrize("tiles", PATH_TILES, ids=lambda t: "-".join(map(str, t)))
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_quantized_input_gives_the_own_quantization_bits(tiles: Tiles, x_dtype: torch.dtype) -> None:
    """A linear of act_quant none over act_qdq(x, fp8_g32, out_dtype bf16) (the model's shared
    quantization, models/deepseek_v41/context.py) gives the bits of act_quant fp8_g32 over x: the same
    qdq values as bf16 operands into the same GEMM, no second rounding."""
    from dsgraph.ops.quant import ActQdqParams
    from dsgraph.platform.cuda.kernels import quant_act

    gen = torch.Generator().manual_seed(41)
    x = (torch.randn(5, 192, generator=gen) * 3).to(x_dtype).to(DEVICE)
    w = tuple(t.to(DEVICE) for t in _weight("fp8_block32", 96, 192, torch.bfloat16, gen))
    own = cuda_linear.linear(_params("fp8_block32", "fp8_g32", "bf16"), x, *w, tiles=tiles)
    xq = quant_act.act_qdq(ActQdqParams(fmt="fp8_g32", out_dtype="bf16"), x)
    shared = cuda_linear.linear(_params("fp8_block32", "none", "bf16"), xq, *w, tiles=tiles)
    assert own.abs().max() > 0
    assert torch.equal(shared.view(torch.int16), own.view(torch.int16)), (shared != own).sum().item()
