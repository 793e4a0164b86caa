"""Overlapped (zero-overhead) scheduling on the GPU with the Triton kernels and captured steps: the same
tokens as plain steps (greedy and seeded, a stop token mid-batch, a length stop), nothing held after, and
"auto" overlaps on cuda. The cpu-side logic is tested in tests/e2e/test_overlap.py."""

from __future__ import annotations

import pytest

from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from tests.e2e.test_overlap import PROMPTS, _assert_nothing_held, _outputs
from tests.oracle import model_fixtures as fx

pytestmark = pytest.mark.gpu


def test_overlap_on_cuda_equals_plain_steps(tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    kw = {"platform": "cuda", "numerics": "reference", "speculative": "off", "max_model_len": 256}
    plain, ahead = LLM(model_dir, overlap="off", **kw), LLM(model_dir, **kw)
    assert plain.engine.overlap is None and ahead.engine.overlap is not None  # auto: on with cuda
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    seeded = [SamplingParams(temperature=1.0, seed=60 + i, max_tokens=12, ignore_eos=True) for i in range(8)]
    for params in (greedy, seeded):
        assert _outputs(ahead, PROMPTS, params) == _outputs(plain, PROMPTS, params)
    stop = _outputs(plain, PROMPTS[:3], greedy)[1][0][2]
    mixed = [greedy, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop_token_ids=(stop,))]
    mixed.append(SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert _outputs(ahead, PROMPTS[:3], mixed) == _outputs(plain, PROMPTS[:3], mixed)
    _assert_nothing_held(ahead.engine)
