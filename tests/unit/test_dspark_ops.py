"""The DSpark ops: `draft_attention` against a plain per-sequence reference (f64, Python loops), its batch
invariance and errors; `sampling_logprobs` against the `sample` op it must agree with and hand references.
"""

from __future__ import annotations

import math

import pytest
import torch

from dsgraph.graph import ShapeError, TensorType, make_graph
from dsgraph.ops import op
from dsgraph.platform.cpu.cache_format import fp8_g32_decode, fp8_g32_encode
from dsgraph.platform.cpu.interpret import ExecutionError, run_graph
from dsgraph.platform.cpu.quant import fp8_g32_qdq
from tests.unit.test_sampling_refs import Rows, bitmask, run_sample

HEADS, HD, WINDOW, RING = 2, 32, 4, 7
SCALE = HD**-0.5


def _only(outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    (value,) = outputs.values()
    return value


def _attention_graph(ring_len: int = RING, window: int = WINDOW, block: int = 3):  # type: ignore[no-untyped-def]
    i32 = "i32"
    types = [
        TensorType(("tokens", HEADS, HD), "f32"),
        TensorType(("tokens", HD), "f32"),
        TensorType(("slots", ring_len, HD + HD // 32), "u8"),
        TensorType((HEADS,), "f32"),
        *[TensorType(("tokens",), i32)] * 2,
        *[TensorType(("seqs",), i32)] * 3,
    ]
    return make_graph(
        lambda *xs: op.draft_attention(*xs, window=window, softmax_scale=SCALE, block_size=block), *types
    )


def _case(seed: int, anchors: list[int], slots: list[int], starts: list[int], block: int = 3):  # type: ignore[no-untyped-def]
    """Random operands: sequence s has `block` rows at anchors[s]..; a padding row ends the step."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(anchors) * block + 1
    ring = fp8_g32_encode(torch.randn(4, RING, HD, generator=gen))
    seq_ids = [s for s in range(len(anchors)) for _ in range(block)] + [-1]
    positions = [a + j for a in anchors for j in range(block)] + [0]
    return [
        torch.randn(rows, HEADS, HD, generator=gen),
        fp8_g32_qdq(torch.randn(rows, HD, generator=gen)),
        ring,
        torch.randn(HEADS, generator=gen),
        torch.tensor(positions, dtype=torch.int32),
        torch.tensor(seq_ids, dtype=torch.int32),
        torch.tensor(slots, dtype=torch.int32),
        torch.tensor(anchors, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
    ]


def _reference(q, kv, ring, sink, positions, seq_ids, slots, anchors, starts):  # type: ignore[no-untyped-def]
    """Per row: context positions max(0, start, a - W) .. a - 1 from the ring, the block, the sink."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        s = int(seq_ids[t])
        if s < 0:
            continue
        a, slot = int(anchors[s]), int(slots[s])
        first = max(0, int(starts[s]), a - WINDOW)
        keys = [fp8_g32_decode(ring[slot, pos % ring.shape[1]]).double() for pos in range(first, a)]
        keys += [kv[u].double() for u in range(kv.shape[0]) if int(seq_ids[u]) == s]
        k = torch.stack(keys)  # [N, hd]
        for h in range(q.shape[1]):
            logits = (k @ q[t, h].double()) * SCALE
            weights = torch.exp(logits)
            total = weights.sum() + math.exp(float(sink[h]))
            out[t, h] = (weights / total) @ k
    return out


@pytest.mark.parametrize(
    ("anchors", "slots", "starts"),
    [
        ([2, 11, 30], [0, 1, 3], [0, 0, 0]),  # partial context, ring wrap-around
        ([9, 20], [2, 0], [7, 18]),  # the window start cuts the context
        ([0], [1], [0]),  # no context at all: the block and the sink
    ],
)
def test_draft_attention_matches_reference(anchors: list[int], slots: list[int], starts: list[int]) -> None:
    args = _case(len(anchors), anchors, slots, starts)
    got = _only(run_graph(_attention_graph(), args))
    want = _reference(*args)
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-5), float((got.double() - want).abs().max())
    assert torch.equal(got[-1], torch.zeros_like(got[-1])), "a padding row gives zeros"


def test_draft_attention_is_batch_invariant() -> None:
    args = _case(5, [3, 12, 25], [0, 1, 2], [0, 0, 0])
    batched = _only(run_graph(_attention_graph(), args))
    for s in range(3):
        rows = slice(3 * s, 3 * s + 3)
        alone = list(args)
        for i in (0, 1, 4, 5):
            alone[i] = args[i][rows]
        alone[5] = torch.zeros(3, dtype=torch.int32)
        for i in (6, 7, 8):
            alone[i] = args[i][s : s + 1]
        got = _only(run_graph(_attention_graph(), alone))
        assert torch.equal(got, batched[rows]), f"sequence {s}"


def test_draft_attention_errors_name_the_problem() -> None:
    args = _case(1, [5, 9], [0, 1], [0, 0])
    args[5] = torch.tensor([0, 1, 0, 1, 1, 0, -1], dtype=torch.int32)
    with pytest.raises(ExecutionError, match="draft_attention: the block of row 0 .* not contiguous"):
        run_graph(_attention_graph(), args)
    args = _case(1, [5, 9], [0, 4], [0, 0])
    with pytest.raises(ExecutionError, match=r"draft_attention: ring slot of row\[3\] is 4, expected 0..3"):
        run_graph(_attention_graph(), args)
    with pytest.raises(
        ExecutionError, match="draft_attention: sequence 0 has 3 rows, more than block_size 2"
    ):
        run_graph(_attention_graph(block=2), _case(1, [5, 9], [0, 1], [0, 0]))
    with pytest.raises(ShapeError, match="ring length R .* is 3, expected >= window 4"):
        _attention_graph(ring_len=3)


def _logprobs(rows: Rows) -> torch.Tensor:
    vocab = rows.logits.shape[1]
    types = [TensorType(("outs", vocab), "f32")] + [
        TensorType(("outs",), d) for d in ("f32", "f32", "i32", "f32")
    ]
    args = rows.tensors()[:5]
    if rows.allowed is not None:
        types.append(TensorType(("outs", -(-vocab // 32)), "i32"))
        args.append(rows.allowed)
    return _only(run_graph(make_graph(lambda *xs: op.sampling_logprobs(*xs), *types), args))


def _mixed_rows(vocab: int = 70) -> Rows:
    gen = torch.Generator().manual_seed(3)
    n = 8
    return Rows(
        torch.randn(n, vocab, generator=gen) * 3,
        temperature=[0.0, 1.0, 0.7, 1.3, 0.5, 1.0, 2.0, 0.9],
        top_p=[1.0, 1.0, 0.8, 1.0, 0.6, 1.0, 0.95, 1.0],
        top_k=[-1, -1, -1, 5, 10, -1, 20, 3],
        min_p=[0.0, 0.0, 0.0, 0.0, 0.1, 0.05, 0.0, 0.0],
        seed=list(range(100, 100 + n)),
        allowed=bitmask([range(vocab)] * 5 + [range(0, vocab, 2), range(vocab), range(vocab)], vocab),
    )


def test_sampling_logprobs_agree_with_the_sample_op() -> None:
    rows = _mixed_rows()
    lp = _logprobs(rows)
    token, logprob, _, _ = run_sample(rows)
    assert torch.equal(lp.gather(1, token.long().unsqueeze(1)).squeeze(1), logprob)
    # normalized, and the truncations keep exactly as many tokens as their hand count says
    assert torch.allclose(torch.logsumexp(lp.double(), dim=1), torch.zeros(8, dtype=torch.float64), atol=1e-6)
    finite = (lp > float("-inf")).sum(1).tolist()
    assert finite[3] == 5 and finite[7] == 3 and finite[5] <= 35
    assert bool((lp[5, 1::2] == float("-inf")).all()), "masked tokens have no mass"


def test_sampling_logprobs_greedy_and_plain_rows() -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 50, generator=gen)
    lp = _logprobs(Rows(logits, temperature=[0.0, 0.5]))
    want = [logits[0].double(), logits[1].double() / 0.5]
    for i, scaled in enumerate(want):
        expected = scaled - torch.logsumexp(scaled, dim=0)
        assert torch.allclose(lp[i].double(), expected, atol=1e-6), f"row {i}"


def test_sampling_logprobs_of_a_dead_row_are_all_minus_inf() -> None:
    lp = _logprobs(Rows(torch.randn(1, 40), allowed=bitmask([[]], 40)))
    assert bool((lp == float("-inf")).all())


def test_sampling_logprobs_shape_rule() -> None:
    types = [TensorType(("outs", 40), "f32")] + [
        TensorType(("outs",), d) for d in ("f32", "f32", "f32", "f32")
    ]
    with pytest.raises(ShapeError, match="op sampling_logprobs: top_k must have dtype"):
        make_graph(lambda *xs: op.sampling_logprobs(*xs), *types)
