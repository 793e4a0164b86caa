"""Sampling runs on the platform of its logits: by default the platform of their device (cpu logits: the
cpu interpreter), or the one given. The cuda platform's lowering of `sample` and `spec_verify` (run by
its runner on a cpu device here) gives the cpu platform's samples and verdicts bit for bit."""

from __future__ import annotations

import torch

from dsgraph.platform.cuda.target import DEFAULTS
from dsgraph.runtime.sampler import Sampler
from dsgraph.runtime.sampling_params import SamplingParams

VOCAB = 97
PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=1.3, min_p=0.05),
]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_sample_on_the_cuda_platform_equals_cpu() -> None:
    plain, cuda = Sampler(VOCAB, 4), Sampler(VOCAB, 4, platform=DEFAULTS)
    logits, positions = _logits(4), torch.arange(4, dtype=torch.int32) + 9
    a = plain.sample(logits, PARAMS, [1, 2, 3, 4], positions)
    b = cuda.sample(logits, PARAMS, [1, 2, 3, 4], positions)
    assert [name for name, _ in plain.runners] == ["cpu"] and [n for n, _ in cuda.runners] == ["cuda"]
    assert cuda.programs and all(p.platform == "cuda" for p in cuda.programs.values())
    for x, y in zip(
        (a.tokens, a.logprobs, a.top_logprobs, a.top_ids),
        (b.tokens, b.logprobs, b.top_logprobs, b.top_ids),
        strict=True,
    ):
        assert torch.equal(x, y)


def test_verify_on_the_cuda_platform_equals_cpu() -> None:
    plain, cuda = Sampler(VOCAB, 4), Sampler(VOCAB, 4, platform=DEFAULTS)
    logits = _logits(4, 1)
    draft_lp = torch.log_softmax(_logits(4, 2), dim=-1)
    draft = torch.tensor([5, 7, 11, 0], dtype=torch.int32)
    args = (logits, draft, draft_lp, PARAMS, [9, 9, 8, 8], torch.tensor([3, 4, 5, 6], dtype=torch.int32))
    bounds = (torch.tensor([0, 2], dtype=torch.int32), torch.tensor([2, 2], dtype=torch.int32))
    for x, y in zip(plain.verify(*args, *bounds), cuda.verify(*args, *bounds), strict=True):
        assert torch.equal(x, y)
