"""The `sample` op's distributions: draws follow the processed softmax (chi-square), top-k / top-p / min-p
keep exactly the tokens a plain-Python reference keeps, and the reported log-probabilities are the
log-softmax of that processed distribution.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.unit.test_sampling_refs import Rows, bitmask, kept_ref, run_sample

# Chi-square critical values at significance 0.001 (tables), by degrees of freedom.
CHI2_CRITICAL_0_001 = {4: 18.467, 5: 20.515}


def _chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs, strict=True))


def _counts(tokens: torch.Tensor, vocab: int) -> list[int]:
    return torch.bincount(tokens.long(), minlength=vocab).tolist()


def _softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    weights = [math.exp(x - top) for x in xs]
    return [w / sum(weights) for w in weights]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draws_follow_the_softmax(temperature: float) -> None:
    probs = [0.04, 0.08, 0.12, 0.16, 0.25, 0.35]
    logits = [math.log(p) + 1.5 for p in probs]  # a shift the softmax must ignore
    n = 12000  # three seeds, 4000 positions each
    seeds, positions = [20240601 + i % 3 for i in range(n)], [i // 3 for i in range(n)]
    rows = Rows(torch.tensor([logits] * n), temperature=temperature, seed=seeds, position=positions)
    counts = _counts(run_sample(rows)[0], len(probs))
    expected = _softmax([x / temperature for x in logits])
    assert _chi_square(counts, expected) < CHI2_CRITICAL_0_001[5], (counts, expected)
    # The same counts are far from the distribution of the other temperature: the test has power.
    wrong = _softmax([x / (1.5 - temperature) for x in logits])
    assert _chi_square(counts, wrong) > 10 * CHI2_CRITICAL_0_001[5]


def test_truncated_draws_follow_the_renormalised_distribution() -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(40, generator=gen) * 2
    kept, logprobs = kept_ref(logits.tolist(), 0.8, top_k=12, top_p=0.875)
    assert len(kept) == 5, "the fixture should keep 5 tokens (top-p cuts inside the top 12)"
    n = 16000
    rows = Rows(logits.expand(n, 40), temperature=0.8, top_k=12, top_p=0.875, seed=99)
    counts = _counts(run_sample(rows)[0], 40)
    assert sum(counts[t] for t in kept) == n
    chi2 = _chi_square([counts[t] for t in kept], [math.exp(logprobs[t]) for t in kept])
    assert chi2 < CHI2_CRITICAL_0_001[4], (counts, kept)


CASES = [
    # temperature, top_k, top_p, min_p
    (1.0, 5, 1.0, 0.0),
    (1.0, -1, 0.75, 0.0),
    (0.5, -1, 1.0, 0.125),
    (1.25, 20, 0.875, 0.0),
    (0.75, 9, 0.5, 0.25),
    (2.0, -1, 0.9375, 0.0625),
    (1.0, 1, 0.5, 0.5),
    (1.0, 64, 1.0, 0.0),  # top_k >= V is off
]


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), CASES)
@pytest.mark.parametrize("masked", [False, True])
def test_truncation_keeps_exactly_the_reference_support(
    temperature: float, top_k: int, top_p: float, min_p: float, masked: bool
) -> None:
    vocab, n = 64, 400
    gen = torch.Generator().manual_seed(int(temperature * 100) + top_k)
    logits = torch.randn(vocab, generator=gen) * 2
    logits[10] = logits[11] = logits[12] = logits.max() - 0.3  # ties near the top: lowest ids first
    allowed = sorted(random.Random(top_k).sample(range(vocab), 40)) if masked else None
    kept, logprobs = kept_ref(logits.tolist(), temperature, top_k, top_p, min_p, set(allowed or range(vocab)))
    rows = Rows(
        logits.expand(n, vocab),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=5,
        allowed=bitmask([allowed] * n, vocab) if allowed else None,
    )
    token, logprob, top, ids = run_sample(rows, k=vocab)
    # The whole processed distribution: finite exactly on the kept tokens, most likely first.
    assert ids[0, : len(kept)].tolist() == kept
    assert torch.all(torch.isfinite(top[0, : len(kept)])) and torch.all(top[0, len(kept) :] == -math.inf)
    want = torch.tensor([logprobs[t] for t in kept], dtype=torch.float64)
    torch.testing.assert_close(top[0, : len(kept)].double(), want, rtol=0, atol=2e-6)
    # Every draw is a kept token, carrying its processed log-probability; small supports are all reached.
    drawn = token.tolist()
    assert set(drawn) <= set(kept)
    if len(kept) <= 5:
        assert set(drawn) == set(kept)
    torch.testing.assert_close(
        logprob.double(), torch.tensor([logprobs[t] for t in drawn], dtype=torch.float64), rtol=0, atol=2e-6
    )


def test_top_logprobs_are_the_head_of_the_processed_distribution() -> None:
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(5, 300, generator=gen)
    rows = Rows(logits, temperature=0.9, top_k=50, seed=2)
    token, logprob, top, ids = run_sample(rows, k=20)
    full_token, _, full_top, full_ids = run_sample(rows, k=300)
    assert torch.equal(token, full_token), "the number of top log-probabilities changed the draw"
    assert torch.equal(top, full_top[:, :20]) and torch.equal(ids, full_ids[:, :20])
    for r in range(5):
        kept, logprobs = kept_ref(logits[r].tolist(), 0.9, top_k=50)
        assert ids[r].tolist() == kept[:20]
        assert math.isclose(logprob[r].item(), logprobs[int(token[r])], abs_tol=2e-6)
        torch.testing.assert_close(
            torch.logsumexp(full_top[r].double(), 0),
            torch.tensor(0.0, dtype=torch.float64),
            atol=1e-6,
            rtol=0,
        )


def test_ties_at_the_top_k_boundary_keep_the_lowest_ids() -> None:
    logits = torch.zeros(2000, 16)
    logits[:, [3, 7, 9, 12]] = 2.0
    token, _, top, ids = run_sample(Rows(logits, top_k=2, seed=21), k=4)
    assert ids[0].tolist() == [3, 7, 9, 12] and top[0, 2:].tolist() == [-math.inf, -math.inf]
    assert set(token.tolist()) == {3, 7}
    # min-p keeps every token tied with the most likely one, and nothing below it.
    token, _, top, _ = run_sample(Rows(logits, min_p=0.5, seed=21), k=5)
    assert set(token.tolist()) == {3, 7, 9, 12} and top[0, 4].item() == -math.inf
