"""The engine on the cuda platform (tiny checkpoint, reference numerics: the serving-numerics tiny model
is chaotic, see test_e2e_gpu.py): the same greedy and seeded tokens as the cpu engine over 32 steps of
a batch, DSpark drafting on the GPU giving the tokens of a non-drafting run, and no recapture for
repeated buckets. The platform field is validated everywhere."""

from __future__ import annotations

import pytest
import torch

from dsgraph.runtime.engine import EngineConfig
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from tests.oracle import model_fixtures as fx

PROMPTS = [fx.prompt(700 + i, n) for i, n in enumerate([3, 17, 5, 30, 9])]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True)


def test_platform_is_validated() -> None:
    with pytest.raises(ValueError, match="platform"):
        EngineConfig.from_flat(platform="tpu")


def _tokens(llm: LLM, params: SamplingParams) -> list[tuple[int, ...]]:
    outs = llm.generate(PROMPTS, params)
    errors = [(i, o.error) for i, o in enumerate(outs) if o.error is not None]
    assert not errors, f"requests failed inside the engine: {errors}"
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.gpu
def test_cuda_engine_matches_cpu_engine(tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    kw = {"numerics": "reference", "max_model_len": 256, "speculative": "off"}
    cpu = LLM(model_dir, platform="cpu", **kw)
    gpu = LLM(model_dir, platform="cuda", **kw)
    assert _tokens(gpu, GREEDY) == _tokens(cpu, GREEDY)
    captures = gpu.engine.session.captures
    assert _tokens(gpu, GREEDY) == _tokens(cpu, GREEDY)
    assert gpu.engine.session.captures == captures  # every bucket was seen by the first run
    assert _tokens(gpu, SEEDED) == _tokens(cpu, SEEDED)
    assert torch.cuda.is_available()


@pytest.mark.gpu
def test_cuda_drafting_keeps_greedy_tokens(tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    kw = {"numerics": "reference", "max_model_len": 256, "platform": "cuda"}
    plain = LLM(model_dir, speculative="off", **kw)
    drafted = LLM(model_dir, speculative="dspark", throughput_curve=((8, 64, 256), (1.0, 1.2, 2.0)), **kw)
    assert _tokens(drafted, GREEDY) == _tokens(plain, GREEDY)
    stats = drafted.engine.spec_stats()
    assert stats is not None


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_cuda_deterministic_drafting_keeps_seeded_tokens(
    tmp_path_factory: pytest.TempPathFactory, batch: int
) -> None:
    """Deterministic mode on the GPU: seeded tokens equal a non-drafting GPU run at batch 1, 7 and 32,
    with confidence scheduling on and drafts accepted at every length (the hook feeds the reference
    continuation with one draft made wrong, at a place that moves every call)."""
    from tests.e2e.test_spec_decode import CURVE, PARAMS, hook_reference
    from tests.e2e.test_spec_decode import PROMPTS as DET_PROMPTS

    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    kw = {"numerics": "reference", "max_model_len": 64, "platform": "cuda"}
    n = len(DET_PROMPTS)  # the hook looks each request's continuation up by its prompt
    plain = LLM(model_dir, speculative="off", max_num_seqs=32, **kw)
    reference = [o.outputs[0].token_ids for o in plain.generate(DET_PROMPTS, PARAMS)]
    det = LLM(
        model_dir,
        speculative="dspark",
        deterministic=True,
        draft_pause=False,
        max_num_seqs=batch,
        throughput_curve=CURVE,
        **kw,
    )
    hook_reference(det, reference)
    got = det.generate(DET_PROMPTS, PARAMS)
    assert [o.error for o in got] == [None] * n
    assert [o.outputs[0].token_ids for o in got] == reference
    assert det.engine.spec_stats()["accepted_tokens"] > 0  # type: ignore[index]
