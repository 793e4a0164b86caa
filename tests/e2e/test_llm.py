"""`LLM.generate` on the tiny random checkpoint: greedy tokens against NeMo, batch independence,
seeded sampling, preemption, prefix caching, bad inputs, streaming."""

from __future__ import annotations

import itertools

import pytest
import torch

from dsgraph.models.deepseek_v41.numerics import REFERENCE
from dsgraph.runtime.engine_config import CudaConfig, EngineConfig
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import RequestError, SamplingParams
from tests.oracle import model_fixtures as fx

PROMPTS = [fx.prompt(500 + i, n) for i, n in enumerate([3, 17, 5, 30, 1, 12, 8, 24])]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


def _tokens(llm: LLM, prompts, params=GREEDY) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_greedy_batch_of_8_is_teacher_forced_argmax_of_nemo(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    nemo_ref = pytest.importorskip("tests.oracle.nemo_ref")
    # top-k limits that select everything: a tie broken differently would change the token legitimately
    model_dir = fx.checkpoint("tiny_select_all", str(tmp_path_factory.getbasetemp()))
    llm = LLM(model_dir, numerics="reference", max_model_len=256, max_num_seqs=8)
    nemo = nemo_ref.load_nemo_model(model_dir)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, GREEDY), strict=True):
        tokens = list(out.outputs[0].token_ids)
        assert len(tokens) == 6
        logits = nemo_ref.nemo_logits(nemo, prompt + tokens[:-1])
        assert torch.argmax(logits[len(prompt) - 1 :], -1).tolist() == tokens


def test_same_tokens_whatever_batch_order_and_chunk_size(model_dir) -> None:  # type: ignore[no-untyped-def]
    base = _tokens(LLM(model_dir, max_model_len=256, max_num_seqs=8), PROMPTS)
    one_by_one = [_tokens(LLM(model_dir, max_model_len=256, max_num_seqs=1), [p])[0] for p in PROMPTS[:3]]
    assert one_by_one == base[:3]
    reversed_order = _tokens(LLM(model_dir, max_model_len=256, max_num_seqs=8), PROMPTS[::-1])
    assert reversed_order[::-1] == base
    small_chunks = _tokens(
        LLM(model_dir, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=16), PROMPTS
    )
    assert small_chunks == base


def test_seeded_sampling_is_reproducible_and_batch_independent(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=256)
    params = [SamplingParams(temperature=1.0, seed=40 + i, max_tokens=8, ignore_eos=True) for i in range(4)]
    together = _tokens(llm, PROMPTS[:4], params)
    again = _tokens(llm, PROMPTS[:4], params)
    alone = [_tokens(llm, [PROMPTS[i]], [params[i]])[0] for i in (2, 0)]
    assert together == again and alone == [together[2], together[0]]
    other_seed = _tokens(
        llm, PROMPTS[:1], [SamplingParams(temperature=1.0, seed=999, max_tokens=8, ignore_eos=True)]
    )
    assert other_seed[0] != together[0]


def test_bad_inputs_name_the_field_and_others_finish(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=64)
    prompts = [PROMPTS[0], [], [5, 999], [5] * 70, PROMPTS[1], PROMPTS[2], PROMPTS[3]]
    params = [GREEDY] * 4 + [SamplingParams(temperature=-1.0), SamplingParams(top_p=1.5), GREEDY]
    outs = llm.generate(prompts, params)
    errors = [o.error for o in outs]
    assert errors[0] is None and errors[6] is None
    assert "prompt" in errors[1] and "non-empty" in errors[1]
    assert "prompt: 999" in errors[2]
    assert "prompt" in errors[3] and "max_model_len 64" in errors[3]
    assert errors[4].startswith("temperature: -1.0") and errors[5].startswith("top_p: 1.5")
    assert outs[0].outputs[0].token_ids == _tokens(LLM(model_dir, max_model_len=64), [PROMPTS[0]])[0]
    assert len(outs[6].outputs[0].token_ids) == 6


def test_stream_pieces_add_up_to_the_final_text(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=256)
    pieces: dict[int, str] = {}
    final = {}
    for index, text, out in llm.stream(PROMPTS[:3], GREEDY):
        pieces[index] = pieces.get(index, "") + text
        final[index] = out
    assert all(final[i].finished and pieces[i] == final[i].outputs[0].text for i in range(3))


def _rank(entry) -> int:  # type: ignore[no-untyped-def]
    return entry.rank


def test_logprobs_and_n(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=256)
    out = llm.generate(
        [PROMPTS[1]],
        SamplingParams(temperature=1.0, seed=5, max_tokens=4, n=3, logprobs=3, ignore_eos=True),
    )[0]
    assert len(out.outputs) == 3 and len({c.token_ids for c in out.outputs}) > 1
    for c in out.outputs:
        assert len(c.logprobs) == 4
        chosen = [pos[t].logprob for pos, t in zip(c.logprobs, c.token_ids, strict=True)]
        assert all(lp <= 0 for lp in chosen) and c.cumulative_logprob == pytest.approx(sum(chosen))
        for pos, token in zip(c.logprobs, c.token_ids, strict=True):
            # vLLM's shape: the chosen token plus the 3 most likely, ranks 1..3 in falling order
            top = sorted((e for e in pos.values() if e.rank is not None and e.rank <= 3), key=_rank)
            assert token in pos and len(pos) in (3, 4) and [e.rank for e in top] == [1, 2, 3]
            assert all(a.logprob >= b.logprob for a, b in itertools.pairwise(top))


def test_prefix_cache_exact_equals_cold_and_counts_hits(model_dir) -> None:  # type: ignore[no-untyped-def]
    shared = fx.prompt(600, 96)
    prompts = [shared + fx.prompt(601 + i, 7) for i in range(3)]
    cold = [_tokens(LLM(model_dir, max_model_len=256, enable_prefix_cache=False), [p])[0] for p in prompts]
    llm = LLM(model_dir, max_model_len=256, prefix_replay="exact")
    warm = [_tokens(llm, [p])[0] for p in prompts]  # one after another: the 2nd and 3rd hit the cache
    assert warm == cold
    looked_up, hit = llm.engine.prefix_cache_stats()
    assert looked_up == 3 * 103 and hit == 2 * 96  # grain lcm(16, 32) = 32 tokens: 96 of the shared 96
    with pytest.raises(
        ValueError, match="EngineConfig.cache.prefix_replay = 'all': expected one of 'exact', 'window'"
    ):
        LLM(model_dir, prefix_replay="all")


# Documented bound of default ("window") prefix replay on the tiny random checkpoint (spec 5.6 item 1):
# the first generated token after a 96-token hit, over the 20 most likely tokens of both runs, has log-probs
# within WINDOW_MAX_NATS of a cold run. Measured over three shared-prefix workloads (serving numerics):
# max 0.44-1.10 nats, mean 0.35-0.50; this workload after the routed-expert BF16 points: max 0.69, mean
# 0.41; 0 with 40 or more replayed tokens. The random model's flat distributions (top log-probs near -3)
# make this a severe case; the error shrinks with the replay length.
WINDOW_MAX_NATS, WINDOW_MEAN_NATS = 1.2, 0.6


def test_prefix_cache_window_replay_stays_close_to_cold(model_dir) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=20, ignore_eos=True)
    shared = fx.prompt(600, 96)
    prompts = [shared + fx.prompt(601 + i, 7) for i in range(6)]
    cold_llm = LLM(model_dir, max_model_len=256, enable_prefix_cache=False)
    cold = [o.outputs[0] for o in cold_llm.generate(prompts, params)]
    llm = LLM(model_dir, max_model_len=256, prefix_replay="window")  # the explicit approximation
    warm = [llm.generate([p], params)[0].outputs[0] for p in prompts]  # the 2nd to 6th hit the cache
    looked_up, hit = llm.engine.prefix_cache_stats()
    assert looked_up == 6 * 103 and hit == 5 * 96
    assert llm.engine.scheduler.native.num_replayed_tokens == 5 * 8  # one window (8) per hit
    assert warm[0] == cold[0]  # no hit: a cold run
    diffs, gaps = [], []
    for c, w in zip(cold[1:], warm[1:], strict=True):
        cold_top = {t: e.logprob for t, e in c.logprobs[0].items()}
        warm_top = {t: e.logprob for t, e in w.logprobs[0].items()}
        diffs.append(max(abs(lp - warm_top[t]) for t, lp in cold_top.items() if t in warm_top))
        gaps.append(max(warm_top.values()) - warm_top[c.token_ids[0]])
    assert max(diffs) <= WINDOW_MAX_NATS and sum(diffs) / len(diffs) <= WINDOW_MEAN_NATS, diffs
    # consequence of the bound: the cold greedy token stays within 2 * bound of the warm run's best token
    assert max(gaps) <= 2 * WINDOW_MAX_NATS, gaps
    assert max(diffs) > 0  # an approximation: not the exact mode's bit-identical result


def test_prompt_logprobs_equal_log_softmax_of_a_full_prefill(model_dir) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS[3]
    llm = LLM(model_dir, max_model_len=256, numerics="reference", max_num_batched_tokens=16)  # 2 chunks
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))[0]
    runner = fx.runner(model_dir, REFERENCE)
    runner.add(0)
    want = torch.log_softmax(runner.step([(0, prompt)])[0].double(), -1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        entry = out.prompt_logprobs[pos][prompt[pos]]
        assert abs(entry.logprob - float(want[pos - 1, prompt[pos]])) < 1e-6, pos
        assert entry.rank == int((want[pos - 1] > want[pos - 1, prompt[pos]]).sum()) + 1
        top3 = torch.topk(want[pos - 1], 3).indices.tolist()
        assert {t for t, e in out.prompt_logprobs[pos].items() if e.rank <= 3} == set(top3)


class _CountingNative:
    """Forwards to the native scheduler, counting the per-step calls."""

    def __init__(self, native) -> None:  # type: ignore[no-untyped-def]
        self.native, self.calls = native, []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        attr = getattr(self.native, name)
        if name in ("schedule", "update", "advance"):
            return lambda *a: (self.calls.append(name), attr(*a))[1]
        return attr


def test_one_native_call_per_step(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=256, max_num_batched_tokens=16)
    counting = _CountingNative(llm.engine.scheduler.native)
    llm.engine.scheduler.native = counting
    steps = 0
    step = llm.engine.step

    def counted_step():  # type: ignore[no-untyped-def]
        nonlocal steps
        steps += 1
        return step()

    llm.engine.step = counted_step  # type: ignore[method-assign]
    llm.generate(PROMPTS[:4], GREEDY)
    assert steps > 5
    assert counting.calls[0] == "schedule" and counting.calls[1:] == ["advance"] * (len(counting.calls) - 1)
    # every step makes exactly one `advance` (commit it, plan the next); only the first also plans itself
    assert counting.calls.count("advance") == steps and len(counting.calls) == steps + 1


def test_engine_config_errors_name_the_field(model_dir) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="EngineConfig.scheduler.max_num_seqs = 0: expected an integer >= 1"):
        LLM(model_dir, max_num_seqs=0)
    with pytest.raises(
        ValueError, match="EngineConfig.numerics = 'fp64': expected one of 'serving', 'reference'"
    ):
        LLM(model_dir, numerics="fp64")
    with pytest.raises(TypeError, match="no_such_option"):
        LLM(model_dir, no_such_option=1)


def test_keyword_options_apply_over_a_given_config(model_dir) -> None:  # type: ignore[no-untyped-def]
    base = EngineConfig(max_model_len=64, cuda=CudaConfig(capture=False))
    llm = LLM(model_dir, config=base, max_num_seqs=2, prefix_replay="window")
    want = EngineConfig.from_flat(max_model_len=64, capture=False, max_num_seqs=2, prefix_replay="window")
    assert llm.engine.config == want and llm.engine.session.cuda == base.cuda
    assert llm.engine.scheduler.config.max_num_seqs == 2


def test_release_forgets_finished_requests_and_aborted_ones_in_flight(model_dir) -> None:  # type: ignore[no-untyped-def]
    from dsgraph.runtime.engine import Engine, EngineConfig

    engine = Engine(model_dir, EngineConfig.from_flat(max_model_len=256))
    engine.add_request(0, PROMPTS[0], GREEDY)
    engine.add_request(1, PROMPTS[1], GREEDY)
    with pytest.raises(ValueError, match="release: request 0 has not finished"):
        engine.release(0)
    engine.step()  # both prefilled; the next plan (already made) holds both
    engine.abort(1)
    engine.release(1)  # released while still in the next step's plan
    finished = []
    while engine.has_unfinished:
        finished += [e.rid for e in engine.step() if e.finished]
    assert finished == [0] and 1 not in engine.live
    engine.release(0)
    assert engine.live == {}


def test_golden_token_ids_are_emitted_then_sampling_continues(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, max_model_len=256)
    prompt, golden = PROMPTS[1], (7, 200, 7, 31)
    forced = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True, golden_token_ids=golden, logprobs=0)
    out = llm.generate([prompt, PROMPTS[2]], [forced, GREEDY])[0].outputs[0]
    assert out.token_ids[:4] == golden and len(out.token_ids) == 7
    # after the forced tokens greedy decoding continues as if they had been part of the prompt
    cont = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    assert (
        out.token_ids[4:]
        == _tokens(LLM(model_dir, max_model_len=256), [list(prompt) + list(golden)], cont)[0]
    )
    assert all(pos[t].logprob <= 0 for pos, t in zip(out.logprobs, out.token_ids, strict=True))
    # stop conditions still apply to forced tokens: a stop token id among them ends the request there
    stopped = SamplingParams(
        temperature=1.0, seed=3, max_tokens=9, golden_token_ids=golden, stop_token_ids=(200,)
    )
    out = llm.generate([prompt], stopped)[0].outputs[0]
    assert out.token_ids == golden[:2] and out.finish_reason == "stop"
    assert (
        llm.generate([prompt], SamplingParams(max_tokens=2, golden_token_ids=golden))[0].outputs[0].token_ids
        == golden[:2]
    )
    with pytest.raises(RequestError, match=r"golden_token_ids\[1\]: 256 must be in 0..255"):
        SamplingParams(golden_token_ids=[3, 256]).validate(256)
