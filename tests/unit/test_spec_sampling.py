"""The `spec_verify` op: greedy acceptance by hand, the sampled acceptance test and residual draw against a
plain-Python reference, the bonus row equal to the `sample` op, batch invariance, and errors that name the
row or sequence.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from dsgraph.graph import TensorType, make_graph
from dsgraph.graph.op import ShapeError
from dsgraph.ops import op
from dsgraph.platform.cpu.interpret import ExecutionError, run_graph
from tests.unit.test_sampling_refs import Rows, bitmask, run_sample
from tests.unit.test_spec_sampling_refs import Seq, run_verify, verify_args, verify_graph, verify_row_ref

V = 8


def _log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    log_total = top + math.log(sum(math.exp(x - top) for x in row))
    return [x - log_total for x in row]


def _row(best: int, second: int | None = None) -> list[float]:
    """Logits with argmax `best`; `second` ties with it (a lower id wins the tie)."""
    row = [0.1 * t for t in range(V)]
    row[best] = 3.0
    if second is not None:
        row[second] = 3.0
    return row


GREEDY_ROWS = [_row(3), _row(5), _row(1), _row(6)]


@pytest.mark.parametrize(
    ("drafts", "accepted", "emitted"),
    [
        ([3, 5, 1], 3, [3, 5, 1, 6]),  # all accepted: the bonus argmax follows
        ([3, 5, 2], 2, [3, 5, 1]),  # third draft wrong: the target's token replaces it
        ([4, 5, 1], 0, [3]),  # first wrong: later drafts are not looked at
        ([3, 0, 1], 1, [3, 5]),
    ],
)
def test_greedy_acceptance_by_hand(drafts: list[int], accepted: int, emitted: list[int]) -> None:
    seq = Seq(torch.tensor(GREEDY_ROWS), drafts, temperature=0.0, position=40, seed=5)
    (got,) = run_verify([seq])
    assert (got.num_accepted, got.tokens) == (accepted, emitted)
    want = [_log_softmax(GREEDY_ROWS[j])[t] for j, t in enumerate(emitted)]
    assert got.logprobs == pytest.approx(want, abs=1e-6)


def test_greedy_ties_go_to_the_lowest_id_and_the_bitmask_rejects() -> None:
    rows = torch.tensor([_row(5, second=2), _row(4)])
    (tie,) = run_verify([Seq(rows, [5], temperature=0.0)])
    assert (tie.num_accepted, tie.tokens) == (0, [2])
    (ok,) = run_verify([Seq(rows, [2], temperature=0.0)])
    assert (ok.num_accepted, ok.tokens) == (1, [2, 4])
    # Row 0 may not emit 2: the argmax over allowed tokens is 5, so draft 2 is rejected for it.
    allowed = bitmask([[t for t in range(V) if t != 2], list(range(V))], V)
    (masked,) = run_verify([Seq(rows, [2], temperature=0.0, allowed=allowed)], masked=True)
    assert (masked.num_accepted, masked.tokens) == (0, [5])


def test_sampled_rows_follow_the_plain_python_reference() -> None:
    rng = random.Random(11)
    gen = torch.Generator().manual_seed(11)
    accepted = rejected = 0
    for i in range(60):
        logits = torch.randn(2, V, generator=gen) * 1.5
        draft_logits = torch.randn(V, generator=gen) * 1.5
        draft_lp = torch.log_softmax(draft_logits.double(), -1)
        draft = rng.randrange(V)
        temperature = rng.choice([1.0, 0.7])
        seq = Seq(
            logits, [draft], draft_lp[None].float(), position=7 * i, seed=1000 + i, temperature=temperature
        )
        (got,) = run_verify([seq])
        probs = torch.softmax(draft_lp.float().double(), -1).tolist()
        ok, token = verify_row_ref(logits[0].tolist(), draft, probs, temperature, 1000 + i, 7 * i)
        assert got.num_accepted == int(ok) and got.tokens[0] == token, (i, got, ok, token)
        accepted, rejected = accepted + ok, rejected + (not ok)
    assert accepted > 10 and rejected > 10, "the fixture must exercise both branches"


def test_a_sequence_without_drafts_is_the_sample_op() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(12, V, generator=gen) * 2
    params = [(1.0, 1.0, -1, 0.0), (0.6, 0.9, 4, 0.0), (0.0, 1.0, -1, 0.0), (1.3, 1.0, -1, 0.2)] * 3
    seqs = [
        Seq(logits[i : i + 1], [], temperature=t, top_p=p, top_k=k, min_p=m, seed=77 + i, position=30 + i)
        for i, (t, p, k, m) in enumerate(params)
    ]
    rows = Rows(
        logits,
        temperature=[p[0] for p in params],
        top_p=[p[1] for p in params],
        top_k=[p[2] for p in params],
        min_p=[p[3] for p in params],
        seed=[77 + i for i in range(12)],
        position=[30 + i for i in range(12)],
    )
    token, logprob = run_sample(rows)[:2]
    got = run_verify(seqs)
    assert [g.tokens[0] for g in got] == token.tolist()
    assert [g.logprobs[0] for g in got] == logprob.tolist()
    assert all(g.num_accepted == 0 for g in got)


def test_equal_distributions_accept_every_draft() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(300, 4, V, generator=gen)
    # The draft's log-probabilities are the target logits themselves: p_d == p_t bit for bit.
    seqs = [
        Seq(x, [int(t) for t in torch.randint(V, (3,), generator=gen)], x[:3], seed=i)
        for i, x in enumerate(logits)
    ]
    assert all(o.num_accepted == 3 for o in run_verify(seqs))


def _mixed_batch(seed: int, count: int) -> list[Seq]:
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(count):
        rows = rng.randrange(1, 6)
        logits = torch.randn(rows, V, generator=gen) * 2
        draft_lp = torch.log_softmax(torch.randn(rows - 1, V, generator=gen) * 2, -1)
        t, k, p = rng.choice([(0.0, -1, 1.0), (1.0, -1, 1.0), (0.8, 5, 0.9), (1.2, -1, 0.8)])
        # Drafts that are likely under the target, so verification runs past the first row.
        drafts = [int(x.argmax()) if rng.random() < 0.7 else rng.randrange(V) for x in logits[:-1]]
        seqs.append(
            Seq(
                logits,
                drafts,
                draft_lp,
                position=rng.randrange(1000),
                seed=i,
                temperature=t,
                top_k=k,
                top_p=p,
            )
        )
    return seqs


def test_batch_invariance_across_composition_order_and_padding() -> None:
    seqs = _mixed_batch(21, 14)
    together = run_verify(seqs)
    assert sum(o.num_accepted for o in together) > len(seqs), "the fixture must accept some drafts"
    alone = [run_verify([s])[0] for s in seqs]
    assert together == alone
    order = list(range(len(seqs)))
    random.Random(2).shuffle(order)
    shuffled = run_verify([seqs[i] for i in order], pad=[2, 0, 3] * 5)
    assert [shuffled[order.index(i)] for i in range(len(seqs))] == together


def test_verify_operand_errors_name_the_row_or_sequence() -> None:
    seqs = [Seq(torch.zeros(3, V), [1, 2]), Seq(torch.zeros(2, V), [4])]
    graph = verify_graph(V)
    args = verify_args(seqs)
    bad = list(args)
    bad[1] = torch.tensor([1, 9, -1, 4, -1], dtype=torch.int32)
    with pytest.raises(
        ExecutionError, match=r"row 1 \(sequence 0, draft 1\) has draft_token 9, expected 0..7"
    ):
        run_graph(graph, bad)
    bad = list(args)
    bad[9] = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ExecutionError, match=r"row 2 belongs to sequences \[0, 1\]"):
        run_graph(graph, bad)
    bad = list(args)
    bad[10] = torch.tensor([3, 3], dtype=torch.int32)
    with pytest.raises(ExecutionError, match=r"sequence 1 has verify_start 3 and verify_len 3; expected"):
        run_graph(graph, bad)
    bad = list(args)
    bad[2] = torch.full((5, V), float("-inf"))
    with pytest.raises(ExecutionError, match=r"row 0 \(sequence 0\) samples but its draft_logprobs hold no"):
        run_graph(graph, bad)


def test_empty_sequences_and_rows_of_no_sequence() -> None:
    graph = verify_graph(V)
    args = verify_args([Seq(torch.tensor(GREEDY_ROWS[:2]), [3], temperature=0.0)], pad=[2])
    args[9] = torch.tensor([2, 0], dtype=torch.int32)
    args[10] = torch.tensor([2, 0], dtype=torch.int32)
    out = run_graph(graph, args)
    num, token, logprob = (out[n] for n in graph.output_names)
    assert num.tolist() == [1, -1]
    assert token.tolist() == [-1, -1, 3, 5]
    assert logprob[:2].tolist() == [float("-inf")] * 2


def test_shape_rule_errors() -> None:
    types = [t for t in verify_graph(V).inputs]
    f32 = TensorType(("outs", V + 1), "f32")
    with pytest.raises(ShapeError, match="draft_logprobs must have the shape of logits"):
        make_graph(
            lambda *xs: op.spec_verify(*xs), types[0].type, types[1].type, f32, *(t.type for t in types[3:])
        )
    with pytest.raises(ShapeError, match="takes 11 operands"):
        make_graph(lambda *xs: op.spec_verify(*xs), *(t.type for t in types[:10]))
    out = make_graph(lambda *xs: op.spec_verify(*xs), *(t.type for t in types)).outputs
    assert [o.type for o in out] == [
        TensorType(("seqs",), "i32"),
        TensorType(("outs",), "i32"),
        TensorType(("outs",), "f32"),
    ]
