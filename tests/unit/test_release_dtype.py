"""Serving holds the LM head in BF16 when its F32 values are exact in BF16 (models/deepseek_v41/weights.py
`release_dtype`): the values are kept, other tensors and inexact heads are untouched, and the reference
numerics keep F32."""

from __future__ import annotations

import torch

from dsgraph.models.deepseek_v41.weights import release_dtype


def test_a_head_of_bf16_values_is_held_in_bf16_with_the_same_values() -> None:
    head = torch.randn(8, 16).to(torch.bfloat16).float()
    held = release_dtype("head.weight", head)
    assert held.dtype == torch.bfloat16 and torch.equal(held.float(), head)


def test_inexact_heads_and_other_tensors_stay_as_they_are() -> None:
    head = torch.randn(8, 16).to(torch.bfloat16).float()
    head[3, 5] += 2.0**-20  # one value not exact in BF16
    assert release_dtype("head.weight", head) is head
    exact = head.to(torch.bfloat16).float()
    assert release_dtype("layers.0.attn.compressor.wkv.weight", exact) is exact
    already = exact.to(torch.bfloat16)
    assert release_dtype("head.weight", already) is already


def test_a_meta_head_has_no_values_to_check_and_stays() -> None:
    head = torch.empty(8, 16, device="meta")
    assert release_dtype("head.weight", head) is head
