"""The `sample` op: shape rule, the counter-based generator, batch invariance, determinism, greedy rows and
the allowed-token bitmask. Distributions (chi-square, truncation, log-probabilities): test_sampling_dist.py.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from dsgraph.graph import ShapeError, TensorType, make_graph
from dsgraph.graph.serialize import deserialize, serialize
from dsgraph.ops import op
from dsgraph.ops.sampling import SampleParams
from dsgraph.platform.cpu.rules_sampling import uniform_draw
from tests.unit.test_sampling_refs import Rows, bitmask, run_sample, splitmix64, uniform_ref

F32, I32, I64 = "f32", "i32", "i64"
OUTS = "outs"


def _types(vocab: int = 40, **over: TensorType) -> list[TensorType]:
    base = {
        "logits": TensorType((OUTS, vocab), F32),
        "temperature": TensorType((OUTS,), F32),
        "top_p": TensorType((OUTS,), F32),
        "top_k": TensorType((OUTS,), I32),
        "min_p": TensorType((OUTS,), F32),
        "seed": TensorType((OUTS,), I64),
        "position": TensorType((OUTS,), I32),
    }
    return list({**base, **over}.values())


@pytest.mark.parametrize(
    ("types", "params", "message"),
    [
        (_types(seed=TensorType((OUTS,), I32)), {}, "seed must have dtype"),
        (_types(logits=TensorType((OUTS, 40), "bf16")), {}, "logits must have dtype"),
        (_types(top_k=TensorType((3,), I32)), {}, "length of top_k"),
        (_types(logits=TensorType((OUTS, "V"), F32)), {}, "vocabulary dim of logits"),
        ([*_types(), TensorType((OUTS, 1), I32)], {}, r"allowed must have shape \[outs, 2\]"),
        (_types(), {"num_top_logprobs": 41}, "num_top_logprobs is 41, expected 0..40"),
        (_types(), {"stream": 4}, "stream is 4, expected 0..3"),
        (_types()[:6], {}, "takes 7 operands"),
    ],
)
def test_shape_rule_names_the_bad_operand(types: list[TensorType], params: dict, message: str) -> None:
    with pytest.raises(ShapeError, match=f"op sample: .*{message}"):
        make_graph(lambda *xs: op.sample(*xs, **params), *types)


def test_shape_rule_outputs() -> None:
    g = make_graph(lambda *xs: op.sample(*xs, num_top_logprobs=5), *_types(), TensorType((OUTS, 2), I32))
    assert [str(v.type) for v in g.outputs] == ["i32[outs]", "f32[outs]", "f32[outs,5]", "i32[outs,5]"]
    assert deserialize(serialize(g)).eqns[0].params == SampleParams(num_top_logprobs=5, stream=0)


def test_generator_is_splitmix64() -> None:
    # Published SplitMix64 outputs of seed 0 (e.g. the reference C code of Vigna's xorshift pages).
    assert splitmix64(0, 3) == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    u = uniform_draw(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int32), 0)
    assert u[0].item() == (0xE220A8397B1DCDAF >> 11) / 2.0**53
    rng = random.Random(5)
    seeds = [0, 1, -1, 2**63 - 1, -(2**63)] + [rng.randrange(-(2**63), 2**63) for _ in range(40)]
    positions = [0, 1, 7, 2**31 - 1] + [rng.randrange(0, 2**31) for _ in range(41)]
    for stream in (0, 1, 3):
        got = uniform_draw(torch.tensor(seeds), torch.tensor(positions, dtype=torch.int32), stream)
        assert got.tolist() == [uniform_ref(s, p, stream) for s, p in zip(seeds, positions, strict=True)]
    # The jumped state of uniform_ref is the stepped generator's: draw n is output n of the seed.
    for seed in seeds[:8]:
        outputs = splitmix64(seed, 4 * 5 + 4)
        for n in range(1, len(outputs) + 1):
            assert uniform_ref(seed, (n - 1) // 4, (n - 1) % 4) == (outputs[n - 1] >> 11) / 2.0**53


def _mixed_rows(vocab: int, rows: int, seed: int, masked: bool) -> Rows:
    """Rows exercising every path: greedy, plain, top-k, top-p, min-p, combined, masked, no allowed token."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[1, 2] = logits[1, 5] = logits[1].max() + 1  # a greedy tie
    kinds = [(0.0, 1.0, -1, 0.0), (0.0, 0.5, 3, 0.0), (1.0, 1.0, -1, 0.0), (0.7, 1.0, 4, 0.0)]
    kinds += [(1.3, 0.75, -1, 0.0), (1.0, 1.0, -1, 0.25), (0.9, 0.875, 6, 0.0625), (2.0, 1.0, 1, 0.0)]
    params = [kinds[i % len(kinds)] for i in range(rows)]
    rng = random.Random(seed)
    allowed = [range(vocab) if i % 3 else rng.sample(range(vocab), vocab // 3 + 1) for i in range(rows)]
    if masked:
        allowed[rows - 1] = []
    return Rows(
        logits,
        temperature=[p[0] for p in params],
        top_p=[p[1] for p in params],
        top_k=[p[2] for p in params],
        min_p=[p[3] for p in params],
        seed=[rng.randrange(-(2**63), 2**63) for _ in range(rows)],
        position=[rng.randrange(0, 5000) for _ in range(rows)],
        allowed=bitmask(allowed, vocab) if masked else None,
    )


def _select(rows: Rows, index: list[int]) -> Rows:
    """The rows `index` of a batch (in that order), with their own positions and parameters."""

    def pick(values: object) -> object:
        return [values[i] for i in index] if isinstance(values, list) else values

    position = list(range(rows.logits.shape[0])) if rows.position is None else list(rows.position)
    return Rows(
        rows.logits[torch.tensor(index)],
        temperature=pick(rows.temperature),
        top_p=pick(rows.top_p),
        top_k=pick(rows.top_k),
        min_p=pick(rows.min_p),
        seed=pick(rows.seed),
        position=pick(position),
        allowed=None if rows.allowed is None else rows.allowed[torch.tensor(index)],
    )


def _assert_same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), (x, y)


@pytest.mark.parametrize("vocab", [7, 70, 1001])
@pytest.mark.parametrize("masked", [False, True])
def test_rows_are_batch_invariant(vocab: int, masked: bool) -> None:
    rows = _mixed_rows(vocab, 17, seed=vocab, masked=masked)
    whole = run_sample(rows, k=5)
    perm = list(range(17))
    random.Random(vocab).shuffle(perm)
    permuted = run_sample(_select(rows, perm), k=5)
    _assert_same(tuple(x[torch.tensor(perm)] for x in whole), permuted)
    parts = [run_sample(_select(rows, list(r)), k=5) for r in (range(0, 3), range(3, 4), range(4, 17))]
    _assert_same(whole, tuple(torch.cat(xs) for xs in zip(*parts, strict=True)))
    for i in (0, 8, 16):
        _assert_same(tuple(x[i : i + 1] for x in whole), run_sample(_select(rows, [i]), k=5))


def test_all_ones_bitmask_equals_no_bitmask() -> None:
    rows = _mixed_rows(70, 9, seed=3, masked=False)
    ones = dataclasses.replace(rows, allowed=torch.full((9, 3), -1, dtype=torch.int32))
    _assert_same(run_sample(rows, k=4), run_sample(ones, k=4))


def test_seeded_draws_are_deterministic_and_seeds_differ() -> None:
    flat = torch.zeros(64, 1000)
    first = run_sample(Rows(flat, seed=11))[0]
    assert torch.equal(first, run_sample(Rows(flat, seed=11))[0])
    other = run_sample(Rows(flat, seed=12))[0]
    assert int((first == other).sum()) <= 2, "seeds 11 and 12 drew (almost) the same tokens"
    assert len(set(first.tolist())) > 50, "positions of one seed repeat their draws"
    # Each row's token is the inverse-CDF pick of the documented uniform: on a flat row, floor(u * V).
    assert first.tolist() == [math.floor(uniform_ref(11, p) * 1000) for p in range(64)]
    streamed = run_sample(Rows(flat, seed=11), stream=2)[0]
    assert streamed.tolist() == [math.floor(uniform_ref(11, p, 2) * 1000) for p in range(64)]


def test_greedy_is_argmax_with_ties_to_the_lowest_id() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen)
    logits[0, [3, 9, 40]] = 10.0
    logits[1, [0, 49]] = 10.0
    temperature = [0.0, 0.0, 0.0, 1e-6, 0.0, 0.0]
    token, logprob, top, ids = run_sample(
        Rows(logits, temperature=temperature, top_k=1, top_p=0.5, seed=3), k=3
    )
    want = [max(range(50), key=lambda t, r=r: (logits[r, t].item(), -t)) for r in range(6)]
    assert token.tolist() == want and want[:2] == [3, 0]
    # Greedy rows report log-probabilities of the masked logits at temperature 1 (no truncation).
    lsm = torch.log_softmax(logits.double(), -1)
    torch.testing.assert_close(logprob, lsm.gather(1, token.long()[:, None])[:, 0].float())
    assert ids[0].tolist() == [3, 9, 40] and torch.all(top > -math.inf)


def test_masked_tokens_are_never_sampled() -> None:
    vocab, n = 70, 3000
    # Words straddle the sign bit (31, 63) and the partial last word (64..69).
    allowed = [5, 31, 32, 63, 64, 69]
    logits = torch.zeros(n, vocab)
    logits[:, 0] = 20.0  # the favourite is masked out
    rows = Rows(logits, temperature=2.0, seed=7, allowed=bitmask([allowed] * n, vocab))
    token, logprob, top, ids = run_sample(rows, k=vocab)
    assert set(token.tolist()) == set(allowed)
    assert torch.all(torch.isinf(top[:, len(allowed) :]))
    assert sorted(ids[0, : len(allowed)].tolist()) == allowed
    torch.testing.assert_close(logprob, torch.full((n,), -math.log(len(allowed))))


def test_a_row_with_no_allowed_token_is_inert() -> None:
    logits = torch.randn(3, 40)
    rows = Rows(logits, seed=1, allowed=bitmask([range(40), [], [7]], 40))
    token, logprob, top, ids = run_sample(rows, k=2)
    assert token.tolist()[1:] == [-1, 7]
    assert logprob[1].item() == -math.inf and torch.all(top[1] == -math.inf) and ids[1].tolist() == [-1, -1]
    _assert_same(tuple(x[:1] for x in run_sample(rows, k=2)), run_sample(_select(rows, [0]), k=2))


def test_a_step_without_sampled_rows() -> None:
    token, logprob, top, ids = run_sample(Rows(torch.zeros(0, 40), temperature=[], seed=[]), k=3)
    assert token.shape == (0,) and logprob.shape == (0,) and top.shape == (0, 3) and ids.shape == (0, 3)
