"""hc_expand's cpu rule (platform/cpu/rules_mhc.py) keeps its temporaries small, with unchanged values.

The 64k-token prefill on the H200 failed to allocate 20 GiB in hc_expand: the rule built the product
comb[i, j] * x_i as one f32 [tokens, n_in, n_out, H] tensor (8n times the bytes of a bf16 output). The
rule now sums one input stream at a time, in row chunks of at most EXPAND_CHUNK_ELEMENTS f32 elements.
Every tensor an op creates is recorded through a dispatch mode (what torch's allocator is asked for).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dsgraph.platform.cpu import rules_mhc


class _Allocations(TorchDispatchMode):
    """Records the storage bytes of every tensor an op returns (views and in-place ops excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if _is_tensor(t)}
        for t in tree_leaves(result):
            if _is_tensor(t) and t.untyped_storage().data_ptr() not in inputs:
                self.sizes.append((str(func), t.untyped_storage().nbytes()))
        return result


def _is_tensor(t: object) -> bool:
    return isinstance(t, torch.Tensor)


def _inputs(tokens: int, n: int, hidden: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(tokens, hidden, generator=gen).bfloat16()
    x = (torch.randn(tokens, n, hidden, generator=gen) * 4).bfloat16()
    return y, x, torch.rand(tokens, n, generator=gen) * 2, torch.rand(tokens, n, n, generator=gen)


def _product_formula(
    y: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """The spec formula as the rule wrote it before (one [tokens, n, n, H] product, torch's sum)."""
    mixed = (comb.unsqueeze(-1) * x.float().unsqueeze(2)).sum(1)
    return (post.unsqueeze(-1) * y.float().unsqueeze(1) + mixed).to(x.dtype)


def test_hc_expand_temporaries_stay_within_twice_the_output() -> None:
    tokens, n, hidden = 2048, 4, 256
    args = _inputs(tokens, n, hidden, 0)
    with _Allocations() as seen:
        got = rules_mhc.hc_expand(None, *args)
    output_bytes = got.numel() * got.element_size()
    biggest = max(seen.sizes, key=lambda s: s[1])
    # f32 temporaries of the output's shape are 2x a bf16 output; the old product tensor was 8n = 32x.
    assert biggest[1] <= 2 * output_bytes, f"{biggest[0]} allocated {biggest[1]} B, output {output_bytes} B"
    assert torch.equal(got.view(torch.int16), _product_formula(*args).view(torch.int16))


@pytest.mark.parametrize("chunk", [1, 4 * 32 * 7])
def test_hc_expand_row_chunks_bound_temporaries_and_change_no_bit(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """With a small chunk (one row, or 7 rows of n=4, H=32) no tensor but the output exceeds the chunk's
    f32 bytes, and the result equals the unchunked formula bit for bit, zeros' signs included."""
    tokens, n, hidden = 50, 4, 32
    y, x, post, comb = _inputs(tokens, n, hidden, 1)
    x[3, :, :5], y[3, :5] = -0.0, -0.0  # -0 terms only: the sum's starting value shows in the sign
    comb[3], post[3] = 1.0, 1.0
    x[5, 2, 7] = float("inf")
    monkeypatch.setattr(rules_mhc, "EXPAND_CHUNK_ELEMENTS", chunk)
    with _Allocations() as seen:
        got = rules_mhc.hc_expand(None, y, x, post, comb)
    rows = max(1, chunk // (n * hidden))
    bound = rows * n * hidden * 4
    over = [s for s in seen.sizes if s[1] > bound and s[1] != got.numel() * got.element_size()]
    assert not over, f"temporaries above {bound} B: {over}"
    assert torch.equal(got.view(torch.int16), _product_formula(y, x, post, comb).view(torch.int16))
    assert not torch.signbit(got[3, :, :5]).any()  # (0 + -0 + ...) + -0 is +0: the sum starts at 0


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_hc_expand_equals_the_product_formula_for_n_up_to_4(n: int) -> None:
    """torch sums at most 4 values along a non-last dim in order from 0; the rule's loop is that order."""
    for tokens, hidden in ((1, 1), (3, 7), (9, 65)):
        y, x, post, comb = _inputs(tokens, n, hidden, 2 + n)
        for dtype, bits in ((torch.bfloat16, torch.int16), (torch.float32, torch.int32)):
            args = (y.to(dtype), x.to(dtype), post, comb)
            got = rules_mhc.hc_expand(None, *args)
            assert torch.equal(got.view(bits), _product_formula(*args).view(bits)), (tokens, hidden, dtype)
