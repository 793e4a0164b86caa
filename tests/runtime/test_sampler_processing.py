"""The Sampler's `processing` variants of the `sample` op (ops/sampling.py): each call's variant is chosen
on the host from its rows' params, and whichever it picks gives the full processing's tokens, logprobs,
top logprobs and ids bit for bit (the token-only variant, for rows whose log-probabilities nobody reads:
the tokens), on ties, dead rows (-inf everywhere, or a bitmask allowing nothing) and structured-output
masks."""

from __future__ import annotations

import random

import pytest
import torch

from dsgraph.graph import make_graph
from dsgraph.graph.op import ShapeError
from dsgraph.graph.types import TensorType
from dsgraph.ops import op
from dsgraph.ops.sampling import SampleParams, mask_words
from dsgraph.platform.cpu import rules_sampling
from dsgraph.runtime.sampler import GRAPHS, Sampler, processing_for, reads_logprobs
from dsgraph.runtime.sampling_params import SamplingParams

VOCAB = 300  # not a multiple of 32: the bitmask's last word is partial
ROWS = 37  # crosses the rule's 16-row chunks


def _choice(params: list[SamplingParams]) -> str:
    return processing_for(Sampler._rows(params, [0] * len(params)), VOCAB)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ([SamplingParams(temperature=0)], "greedy"),
        ([SamplingParams(temperature=0, top_p=0.9, top_k=3, min_p=0.5)], "greedy"),  # greedy rows ignore them
        ([SamplingParams(temperature=0), SamplingParams(temperature=9e-6)], "greedy"),
        ([SamplingParams(temperature=0), SamplingParams(temperature=1e-5)], "untruncated"),
        ([SamplingParams()], "untruncated"),
        ([SamplingParams(temperature=0.7, top_k=VOCAB), SamplingParams(top_k=10**6)], "untruncated"),
        ([SamplingParams(temperature=0, top_p=0.5), SamplingParams(temperature=1.3)], "untruncated"),
        ([SamplingParams(top_p=0.99999999)], "untruncated"),  # 1.0 as the op's f32 operand holds it
        ([SamplingParams(min_p=1e-46)], "untruncated"),  # 0 in f32
        ([SamplingParams(temperature=0), SamplingParams(top_p=0.9)], "full"),
        ([SamplingParams(), SamplingParams(top_p=0.9999)], "full"),
        ([SamplingParams(top_k=VOCAB - 1)], "full"),
        ([SamplingParams(top_k=1)], "full"),
        ([SamplingParams(min_p=0.05)], "full"),
        ([SamplingParams(min_p=1e-40)], "full"),  # an f32 subnormal, still > 0
    ],
)
def test_the_variant_is_chosen_from_the_rows_params(params: list[SamplingParams], expected: str) -> None:
    assert _choice(params) == expected


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ([SamplingParams(temperature=0)], "greedy_token"),
        # prompt logprobs and forced tokens' logprobs come from the logits, not from the samples
        ([SamplingParams(temperature=0, prompt_logprobs=2, golden_token_ids=(4,))], "greedy_token"),
        ([SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=0)], "greedy"),
        ([SamplingParams(temperature=0), SamplingParams()], "untruncated"),
        ([SamplingParams(temperature=0), SamplingParams(top_k=3)], "full"),
    ],
)
def test_greedy_rows_whose_logprobs_nobody_reads_take_the_token_only(
    params: list[SamplingParams], expected: str
) -> None:
    rows = Sampler._rows(params, [0] * len(params))
    assert processing_for(rows, VOCAB, reads_logprobs(params)) == expected


@pytest.mark.parametrize("masked", [False, True])
def test_the_token_only_variant_gives_the_full_processings_tokens(masked: bool) -> None:
    """Ties (integer logits), -inf tokens, dead rows (-inf everywhere, or a mask allowing nothing): the
    argmax gives the sort's tokens; the log-probabilities are NaN (not computed)."""
    sampler = Sampler(VOCAB, 20)
    for trial in range(3):
        rng, gen = random.Random(trial), torch.Generator().manual_seed(trial)
        params = [SamplingParams(temperature=rng.choice([0.0, 1e-6])) for _ in range(ROWS)]
        seeds = [rng.randrange(-(2**63), 2**63) for _ in range(ROWS)]
        positions = torch.randint(0, 1000, (ROWS,), generator=gen, dtype=torch.int32)
        logits = _logits(gen)
        allowed = _allowed(gen) if masked else None
        got = sampler.sample(logits, params, seeds, positions, allowed=allowed)
        want = _full(20, logits, params, seeds, positions, allowed)
        assert got.tokens.dtype == want[0].dtype and torch.equal(got.tokens, want[0])
        assert got.tokens[0] == -1 and (not masked or got.tokens[3] == -1)
        assert got.logprobs.isnan().all() and got.top_logprobs.isnan().all() and (got.top_ids == -1).all()
    assert {graph for graph, _, _ in sampler.programs} == {_name(masked, "greedy_token")}


def _greedy(rng: random.Random) -> SamplingParams:
    """Greedy rows whose log-probabilities are read (logprobs=0), as the comparisons below read them."""
    return SamplingParams(
        logprobs=0,
        temperature=rng.choice([0.0, 1e-6]),
        top_p=rng.choice([1.0, 0.3]),
        top_k=rng.choice([-1, 2]),
        min_p=rng.choice([0.0, 0.2]),
    )


def _untruncated(rng: random.Random) -> SamplingParams:
    if rng.random() < 0.3:
        return _greedy(rng)
    return SamplingParams(temperature=rng.choice([0.5, 1.0, 1.7]), top_k=rng.choice([-1, VOCAB, 10**6]))


def _truncated(rng: random.Random) -> SamplingParams:
    if rng.random() < 0.4:
        return _untruncated(rng)
    return SamplingParams(
        temperature=rng.choice([0.5, 1.0, 1.7]),
        top_p=rng.choice([1.0, 0.9, 0.5]),
        top_k=rng.choice([-1, 1, 5, VOCAB - 1]),
        min_p=rng.choice([0.0, 0.05, 0.3]),
    )


def _logits(gen: torch.Generator) -> torch.Tensor:
    """Integer logits (many ties, so the stable order matters), some tokens -inf, rows 0 and 5 dead."""
    logits = torch.randint(-4, 4, (ROWS, VOCAB), generator=gen).float()
    logits[torch.rand(ROWS, VOCAB, generator=gen) < 0.2] = float("-inf")
    logits[0] = logits[5] = float("-inf")
    logits[7, 1:] = float("-inf")  # one finite token
    return logits


def _allowed(gen: torch.Generator) -> torch.Tensor:
    """A random bitmask; row 3 allows nothing (dead by the mask) and row 4 everything."""
    words = torch.randint(-(2**31), 2**31, (ROWS, mask_words(VOCAB)), generator=gen, dtype=torch.int64)
    words[3], words[4] = 0, -1
    return words.to(torch.int32)


def _full(k: int, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], positions, allowed):  # type: ignore[no-untyped-def]
    """The full processing on the operands the Sampler gives the op."""
    operands = [logits, *Sampler._rows(params, seeds), positions, *([] if allowed is None else [allowed])]
    return rules_sampling.sample(SampleParams(num_top_logprobs=k, processing="full"), *operands)


@pytest.mark.parametrize("k", [0, 20])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(
    ("mix", "expected"), [(_greedy, "greedy"), (_untruncated, "untruncated"), (_truncated, "full")]
)
def test_every_variant_gives_the_full_processings_samples(k: int, masked: bool, mix, expected: str) -> None:  # type: ignore[no-untyped-def]
    sampler = Sampler(VOCAB, k)
    for trial in range(3):
        rng, gen = random.Random(trial), torch.Generator().manual_seed(trial)
        params = [mix(rng) for _ in range(ROWS)]
        seeds = [rng.randrange(-(2**63), 2**63) for _ in range(ROWS)]
        positions = torch.randint(0, 1000, (ROWS,), generator=gen, dtype=torch.int32)
        logits = _logits(gen)
        allowed = _allowed(gen) if masked else None
        got = sampler.sample(logits, params, seeds, positions, allowed=allowed)
        want = _full(k, logits, params, seeds, positions, allowed)
        for x, y in zip((got.tokens, got.logprobs, got.top_logprobs, got.top_ids), want, strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y)
        assert got.tokens[0] == -1 and (not masked or got.tokens[3] == -1)  # the dead rows are there
    # the mix really ran the expected variant (and only it)
    assert {graph for graph, _, _ in sampler.programs} == {sampler.graphs[_name(masked, expected)].name}


def _name(masked: bool, processing: str) -> str:
    base = "sample_masked" if masked else "sample"
    return base if processing == "full" else f"{base}_{processing}"


def test_the_untruncated_variant_differs_on_a_row_that_truncates() -> None:
    """Why the choice matters: top_p 0.5 on a row with one dominant token keeps only it."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 7] = 10.0
    rows = Sampler._rows([SamplingParams(top_p=0.5)], [1])
    operands = (logits, *rows, torch.tensor([3], dtype=torch.int32))
    full = rules_sampling.sample(SampleParams(num_top_logprobs=2), *operands)
    loose = rules_sampling.sample(SampleParams(num_top_logprobs=2, processing="untruncated"), *operands)
    assert full[2][0, 1] == float("-inf") and loose[2][0, 1] > float("-inf")


def test_the_sampler_keeps_one_program_per_variant_and_rows() -> None:
    sampler = Sampler(VOCAB, 0)
    logits, gen = torch.randn(4, VOCAB), torch.Generator().manual_seed(0)
    positions = torch.randint(0, 9, (4,), generator=gen, dtype=torch.int32)
    for params in (
        [SamplingParams(temperature=0, logprobs=0)] * 4,
        [SamplingParams()] * 4,
        [SamplingParams(top_k=3)] * 4,
    ):
        for _ in range(2):
            sampler.sample(logits, params, [1, 2, 3, 4], positions)
    sampler.sample(logits[:2], [SamplingParams()] * 2, [1, 2], positions[:2])
    keys = sorted((graph, rows) for graph, _, rows in sampler.programs)
    assert keys == [("sample", 4), ("sample_greedy", 4), ("sample_untruncated", 2), ("sample_untruncated", 4)]


def test_graphs_missing_from_a_bundle_are_traced() -> None:
    """A bundle written before the variants stores the four base graphs only."""
    base = Sampler(VOCAB, 0).graphs
    old = {n: base[n] for n in ("sample", "spec_verify", "sample_masked", "spec_verify_masked")}
    sampler = Sampler(VOCAB, 0, graphs=old)
    assert set(sampler.graphs) == set(GRAPHS) and all(sampler.graphs[n] is g for n, g in old.items())
    assert sampler.graphs["sample_greedy"].eqns[0].params.processing == "greedy"


def test_processing_must_be_a_known_variant() -> None:
    types = [TensorType((2, VOCAB), "f32")]
    types += [TensorType((2,), d) for d in ("f32", "f32", "i32", "f32", "i64", "i32")]
    with pytest.raises(ShapeError, match=r"param processing is 'fast', expected one of \('full', "):
        make_graph(lambda *xs: op.sample(*xs, processing="fast"), *types)
