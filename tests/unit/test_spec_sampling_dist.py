"""Speculative sampling is exact: over many fixed seeds, the token `spec_verify` emits at each position
follows the target distribution (chi-square), for drafts from several distributions (generic, disjoint
support, equal to the target, a point mass), with and without the target's top-k/top-p processing; the
first draft is accepted with probability sum(min(p_t, p_d)).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.test_sampling_refs import kept_ref
from tests.unit.test_spec_sampling_refs import Seq, run_verify

# Chi-square critical values at significance 0.001 (tables), by degrees of freedom.
CHI2_CRITICAL_0_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}
V = 6
RUNS = 6000

GENERIC = [0.05, 0.10, 0.15, 0.20, 0.22, 0.28]
FLAT = [1 / 6] * 6
LOW = [0.5, 0.3, 0.2, 0.0, 0.0, 0.0]  # support {0, 1, 2}
HIGH = [0.0, 0.0, 0.0, 0.25, 0.35, 0.40]  # support {3, 4, 5}: disjoint from LOW
POINT = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]

# (target probs per row, draft probs per draft row, temperature, top_k, top_p). The target logits are
# log(probs) (-inf at 0), so at temperature 1 without truncation p_t is the listed distribution.
CASES = {
    "generic": ([GENERIC, FLAT, LOW], [FLAT, GENERIC], 1.0, -1, 1.0),
    "disjoint": ([HIGH, LOW, GENERIC], [LOW, HIGH], 1.0, -1, 1.0),
    "equal": ([GENERIC, LOW, FLAT], [GENERIC, LOW], 1.0, -1, 1.0),
    "point_mass": ([GENERIC, HIGH, FLAT], [POINT, POINT], 1.0, -1, 1.0),
    "processed": ([GENERIC, FLAT, GENERIC], [GENERIC, HIGH], 0.7, 4, 0.9),
}


def _log(probs: list[float]) -> list[float]:
    return [math.log(p) if p > 0 else -math.inf for p in probs]


def _target(row: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """The processed target distribution, from the plain-Python reference of the `sample` op."""
    _, logprobs = kept_ref(_log(row), temperature, top_k=top_k, top_p=top_p)
    return [math.exp(logprobs[t]) if t in logprobs else 0.0 for t in range(V)]


def _chi_square(counts: list[int], probs: list[float]) -> tuple[float, int]:
    """(statistic, degrees of freedom) over the categories of positive probability."""
    total = sum(counts)
    cells = [(c, p) for c, p in zip(counts, probs, strict=True) if p > 0]
    return sum((c - total * p) ** 2 / (total * p) for c, p in cells), len(cells) - 1


def _run(case: str) -> tuple[list, list[list[float]], list[list[float]]]:
    rows, drafts, temperature, top_k, top_p = CASES[case]
    logits = torch.tensor([_log(r) for r in rows], dtype=torch.float32)
    draft_lp = torch.tensor([_log(r) for r in drafts], dtype=torch.float32)
    gen = torch.Generator().manual_seed(sorted(CASES).index(case))
    # The drafts are drawn from p_d by the test (the drafter's own randomness), one set per run.
    sampled = torch.stack([torch.multinomial(torch.tensor(d), RUNS, True, generator=gen) for d in drafts], 1)
    seqs = [
        Seq(
            logits,
            sampled[i].tolist(),
            draft_lp,
            position=500,
            seed=9000 + i,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        for i in range(RUNS)
    ]
    targets = [_target(r, temperature, top_k, top_p) for r in rows]
    return run_verify(seqs), targets, drafts


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_tokens_follow_the_target_at_every_position(case: str) -> None:
    outcomes, targets, drafts = _run(case)
    for j, target in enumerate(targets):
        counts = [0] * V
        for o in outcomes:
            if o.num_accepted >= j:
                counts[o.tokens[j]] += 1
        assert all(c == 0 for c, p in zip(counts, target, strict=True) if p == 0), (j, counts, target)
        if sum(counts) < 500:
            continue  # too few runs reach this position for a test (e.g. disjoint supports never accept)
        stat, dof = _chi_square(counts, target)
        assert stat < CHI2_CRITICAL_0_001[dof], (case, j, counts, target)
    # Acceptance of the first draft: probability sum(min(p_t, p_d)).
    rate = sum(min(a, b) for a, b in zip(targets[0], drafts[0], strict=True))
    got = sum(o.num_accepted >= 1 for o in outcomes) / RUNS
    assert abs(got - rate) <= 4.5 * math.sqrt(max(rate * (1 - rate), 1e-12) / RUNS) + 1e-12, (case, got, rate)


def test_the_chi_square_has_power() -> None:
    """The same counts are far from the draft's distribution (no verification) and from an even mix of
    the target and the normalised residual (a verifier whose residual draw is biased)."""
    outcomes, targets, drafts = _run("generic")
    counts = [0] * V
    for o in outcomes:
        counts[o.tokens[0]] += 1
    assert _chi_square(counts, targets[0])[0] < CHI2_CRITICAL_0_001[5]
    assert _chi_square(counts, drafts[0])[0] > 10 * CHI2_CRITICAL_0_001[5]
    residual = [max(0.0, a - b) for a, b in zip(targets[0], drafts[0], strict=True)]
    mixed = [0.5 * a + 0.5 * r / sum(residual) for a, r in zip(targets[0], residual, strict=True)]
    assert _chi_square(counts, mixed)[0] > 10 * CHI2_CRITICAL_0_001[5]
