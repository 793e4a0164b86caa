"""The cuda rule of `sample` for "greedy_token" rows (platform/cuda/kernels/sampling.py: a split argmax and
a merge) against the cpu rule: the same token ids on ties inside and across pieces, NaN and +-inf logits,
dead rows, the allowed-token bitmask; NaN log-probabilities and -1 top ids; other processings run the
cpu rule. On a CUDA machine the kernels run on the GPU, elsewhere under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.ops.sampling import SampleParams  # noqa: E402
from dsgraph.platform.cpu.rules_sampling import sample as cpu_sample  # noqa: E402
from dsgraph.platform.cuda.kernels import sampling as cuda_sampling  # noqa: E402
from tests.cuda.kernel_env import on_device  # noqa: E402

NAN, INF = float("nan"), float("inf")
GREEDY = SampleParams(num_top_logprobs=3, processing="greedy_token")


def _operands(logits: torch.Tensor) -> list[torch.Tensor]:
    rows = logits.shape[0]
    return [
        logits,
        torch.zeros(rows),
        torch.ones(rows),
        torch.zeros(rows, dtype=torch.int32),
        torch.zeros(rows),
        torch.arange(rows, dtype=torch.int64),
        torch.arange(rows, dtype=torch.int32),
    ]


def _hard_rows(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, vocab, generator=g)
    x[1, [5, 70, 190]] = 9.0  # a tie inside the first piece and across pieces: the lowest id
    x[2, [150, 80]] = 9.0  # a tie across pieces only
    x[3, [40, 170]] = NAN  # a NaN wins over every number: the first NaN
    x[3, 2] = INF
    x[4] = -INF  # dead
    x[5] = NAN  # no logit above -inf: dead
    x[6, :] = -INF
    x[6, 199] = NAN  # NaN and -inf only: dead
    x[7, 123] = INF  # +inf wins
    x[8, :] = -INF
    x[8, vocab - 1] = -3.0  # the one live logit is the tail's last
    x[9, 64:] = x[9, :64].max() + 1.0  # the whole second piece ties
    return x


def _assert_same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    token, logprob, top_lp, top_ids = (t.cpu() for t in got)
    assert token.dtype == torch.int32 and torch.equal(token, want[0])
    assert logprob.shape == want[1].shape and bool(torch.isnan(logprob).all() and torch.isnan(want[1]).all())
    assert top_lp.shape == want[2].shape and bool(torch.isnan(top_lp).all())
    assert torch.equal(top_ids, want[3])


@pytest.mark.parametrize("chunk", [64, 256], ids=["pieces", "one-piece"])
def test_greedy_tokens_are_the_cpu_rules(chunk: int) -> None:
    args = _operands(_hard_rows(200))
    want = cpu_sample(GREEDY, *args)
    assert want[0].tolist()[1:10] == [5, 80, 40, -1, -1, -1, 123, 199, 64]  # the cases are what they say
    _assert_same(cuda_sampling.sample(GREEDY, *on_device(args), chunk=chunk), want)


def test_the_bitmask_masks_first() -> None:
    g = torch.Generator().manual_seed(1)
    logits = _hard_rows(200)
    words = torch.randint(-(2**31), 2**31 - 1, (10, 7), generator=g, dtype=torch.int64).to(torch.int32)
    words[0] = 0  # nothing allowed: dead
    words[3] = -1  # everything allowed: the NaN still wins
    words[1, 0] = 0  # ids 0..31 banned: id 5 loses its tie to 70
    args = [*_operands(logits), words]
    want = cpu_sample(GREEDY, *args)
    assert want[0][0] == -1 and want[0][1] == 70 and want[0][3] == 40
    _assert_same(cuda_sampling.sample(GREEDY, *on_device(args), chunk=64), want)


def test_no_top_logprobs_and_no_rows() -> None:
    p = SampleParams(processing="greedy_token")
    args = _operands(_hard_rows(200))
    _assert_same(cuda_sampling.sample(p, *on_device(args), chunk=64), cpu_sample(p, *args))
    empty = _operands(torch.zeros(0, 200))
    got = cuda_sampling.sample(p, *on_device(empty), chunk=64)
    assert [tuple(t.shape) for t in got] == [(0,), (0,), (0, 0), (0, 0)]


def test_other_processings_run_the_cpu_rule() -> None:
    args = _operands(torch.randn(4, 200, generator=torch.Generator().manual_seed(2)))
    args[1] = torch.tensor([0.0, 0.7, 1.0, 0.3])  # sampled rows
    p = SampleParams(num_top_logprobs=2)
    got = cuda_sampling.sample(p, *on_device(args))
    want = cpu_sample(p, *on_device(args))  # on the same device: the f64 sums round as the rule's
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_cuda_platform_runs_this_rule() -> None:
    from dsgraph.platform.cuda.target import PLATFORM

    assert PLATFORM.rules["sample"] is cuda_sampling.sample
