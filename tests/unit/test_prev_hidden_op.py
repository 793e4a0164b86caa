"""`prev_hidden` (ops/mtp.py): each row's previous-position hidden state, from the chunk or the slot's ring,
against a hand-written loop; its shape rule and its error for rows that are not contiguous."""

from __future__ import annotations

import pytest
import torch

import dsgraph.ops  # noqa: F401
from dsgraph.graph import ShapeError
from dsgraph.ops import op
from dsgraph.platform.cpu.interpret import ExecutionError
from tests.unit.ops_b_refs import i32, run1, tt

T, S, W, R = "tokens", "seqs", 3, 5


def _run(ring: torch.Tensor, pos: list[int], ids: list[int], slot: list[int], start: list[int], hidden=None):  # type: ignore[no-untyped-def]
    types = [tt(tuple(ring.shape), "u8"), tt((T,)), tt((T,)), tt((S,)), tt((S,))]
    args = [ring, i32(pos), i32(ids), i32(slot), i32(start)]
    if hidden is not None:
        types.append(tt((T, W), "f32"))
        args.append(hidden)
    return run1(lambda *xs: {"out": op.prev_hidden(*xs)}, types, args)["out"]


def _want(ring_f32, pos, ids, slot, start, hidden):  # type: ignore[no-untyped-def]
    out = torch.zeros(len(pos), W)
    for t, (p, s) in enumerate(zip(pos, ids, strict=True)):
        if s < 0 or p == 0:
            continue
        if hidden is not None and p > start[s]:
            out[t] = hidden[t - 1]
        else:
            out[t] = ring_f32[slot[s], (p - 1) % R]
    return out


def test_rows_read_the_chunk_or_the_ring() -> None:
    gen = torch.Generator().manual_seed(0)
    ring_f32 = torch.randn(3, R, W, generator=gen)
    ring = ring_f32.view(torch.uint8)  # [3, R, 4W]: f32 entries
    # sequence 0 (slot 2) continues at position 7 (ring reads 6, wrapping), sequence 1 (slot 0) starts at 0;
    # a padding row between them
    pos, ids, slot, start = [7, 8, 9, 0, 0, 1, 2], [0, 0, 0, -1, 1, 1, 1], [2, 0], [7, 0]
    hidden = torch.randn(len(pos), W, generator=gen)
    got = _run(ring, pos, ids, slot, start, hidden)
    assert torch.equal(got, _want(ring_f32, pos, ids, slot, start, hidden))
    # without hidden (a draft pass): every real row reads the ring
    anchors = _run(ring, [7, 4], [0, 1], [2, 1], [7, 4])
    assert torch.equal(anchors, torch.stack([ring_f32[2, 6 % R], ring_f32[1, 3]]))


def test_a_row_after_its_chunk_start_must_follow_its_previous_position() -> None:
    ring = torch.zeros(1, R, 4 * W, dtype=torch.uint8)
    with pytest.raises(ExecutionError, match="row 1 .* rows must be contiguous"):
        _run(ring, [4, 6], [0, 0], [0], [4], torch.zeros(2, W))


def test_shape_rule_names_the_operand() -> None:
    ring = tt((3, R, 4 * W), "u8")
    rows = [tt((T,)), tt((T,)), tt((S,)), tt((S,))]
    with pytest.raises(ShapeError, match="width of hidden"):
        op.prev_hidden.rule(op.prev_hidden.params_type(), (ring, *rows, tt((T, W + 1), "f32")))
    with pytest.raises(ShapeError, match="multiple of 4"):
        op.prev_hidden.rule(op.prev_hidden.params_type(), (tt((3, R, 6), "u8"), *rows))
