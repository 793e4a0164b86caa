"""DeepSeek-V4 on the cuda platform (tiny checkpoint, reference numerics): the same greedy tokens and
prompt log-probabilities as the cpu engine, with every step captured into CUDA graphs (the compressor and
the f32-format attention run their capturable torch rules on the device)."""

from __future__ import annotations

import pytest

from dsgraph.models.deepseek_v4.tiny import make_tiny
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams

PROMPTS = [[3 + (i * 37 + k) % 250 for i in range(n)] for k, n in enumerate([3, 17, 40, 70])]


@pytest.mark.gpu
def test_v4_cuda_engine_matches_cpu_engine(tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir = str(make_tiny(tmp_path_factory.mktemp("v4") / "tiny", seed=0))
    kw = {"numerics": "reference", "max_model_len": 256}
    cpu, gpu = LLM(model_dir, platform="cpu", **kw), LLM(model_dir, platform="cuda", **kw)
    batch = [{"prompt_token_ids": p} for p in PROMPTS]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=0)
    want, got = cpu.generate(batch, greedy), gpu.generate(batch, greedy)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    for a, b in zip(got, want, strict=True):
        for pa, pb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            (ta, la), (tb, lb) = next(iter(pa.items())), next(iter(pb.items()))
            assert ta == tb and abs(la.logprob - lb.logprob) <= 1e-4
    assert gpu.engine.session.captures > 0
