"""The public Session API (runtime/session.py, runtime/step_builder.py): built from a checkpoint and a
config in one call, a request prefilled and decoded through typed steps gives the engine's greedy
tokens, and bad steps fail naming what is wrong."""

from __future__ import annotations

import pytest
import torch

from dsgraph import LLM, EngineConfig, SamplingParams, Session
from dsgraph.runtime import CachePoolError, Step
from dsgraph.tools.generate_cmd import default_model_dir

CONFIG = EngineConfig.from_flat(max_model_len=128, max_num_seqs=2)
PROMPTS = ([5, 17, 9, 33, 2], [40, 41])


@pytest.fixture(scope="module")
def session() -> Session:
    return Session.from_checkpoint(default_model_dir(), CONFIG)


def _greedy(session: Session, prompts: tuple[list[int], ...], steps: int) -> list[list[int]]:
    """Prefill every prompt in one step (its last row's logits), then decode them together."""
    seqs = [session.open_sequence() for _ in prompts]
    builder = session.new_step()
    for seq, prompt in zip(seqs, prompts, strict=True):
        builder.add(seq, prompt)
    step = builder.build()
    out = [[int(row[-1].argmax())] for row in step.split(session.run(step))]
    for _ in range(steps - 1):
        builder = session.new_step()
        for seq, toks in zip(seqs, out, strict=True):
            builder.add(seq, toks[-1:])
        logits = session.run(builder.build())
        for toks, row in zip(out, logits, strict=True):
            toks.append(int(row.argmax()))
    for seq, prompt, toks in zip(seqs, prompts, out, strict=True):
        assert seq.tokens == [*prompt, *toks[:-1]]  # the last token is sampled, not yet in the caches
        session.close_sequence(seq)
    return out


def test_prefill_and_decode_give_the_engines_greedy_tokens(session: Session) -> None:
    got = _greedy(session, PROMPTS, 6)
    llm = LLM(default_model_dir(), max_model_len=128, max_num_seqs=2, enable_prefix_cache=False)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = [
        list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)
    ]
    assert got == want


def test_a_built_step_lays_out_the_flat_batch(session: Session) -> None:
    a, b = session.open_sequence(), session.open_sequence()
    try:
        step = session.new_step().add(a, [7, 8, 9], logits="all").add(b, [3], logits="none").build()
        assert isinstance(step, Step) and step.num_logits == (3, 0)
        x = step.inputs
        assert x["token_ids"].tolist() == [7, 8, 9, 3] and x["seq_ids"].tolist() == [0, 0, 0, 1]
        assert x["positions"].tolist() == [0, 1, 2, 0] and x["sample_rows"].tolist() == [0, 1, 2]
        assert x["seq_slot"].tolist() == [a.slot, b.slot] and x["lookback"].shape == (2, 3)
        assert set(x) == set(session.model.step_types())
        logits = session.run(step)
        assert logits.shape == (3, session.model.cfg.text.vocab_size) and a.tokens == [7, 8, 9]
        nxt = session.new_step().add(a, [10]).build().inputs
        assert nxt["positions"].tolist() == [3] and nxt["lookback"][0].tolist() == [9, 8, 7]
    finally:
        session.close_sequence(a)
        session.close_sequence(b)


def test_bad_steps_fail_naming_the_problem(session: Session) -> None:
    seq = session.open_sequence()
    vocab = session.model.cfg.text.vocab_size
    with pytest.raises(ValueError, match=rf"tokens: id {vocab} is outside the vocabulary \[0, {vocab}\)"):
        session.new_step().add(seq, [1, vocab])
    with pytest.raises(ValueError, match="tokens: empty"):
        session.new_step().add(seq, [])
    with pytest.raises(ValueError, match="already has a chunk"):
        session.new_step().add(seq, [1]).add(seq, [2])
    with pytest.raises(ValueError, match="logits: 'first'"):
        session.new_step().add(seq, [1], logits="first")
    with pytest.raises(ValueError, match="no chunk"):
        session.new_step().build()
    with pytest.raises(CachePoolError, match="longer than max_model_len 128"):
        session.new_step().add(seq, [1] * 129).build()
    other = session.open_sequence()
    with pytest.raises(CachePoolError, match="every state slot is held"):
        session.open_sequence()
    session.close_sequence(other)
    session.close_sequence(seq)
    with pytest.raises(ValueError, match="is closed"):
        session.new_step().add(seq, [1])
    with pytest.raises(CachePoolError, match="already closed"):
        session.close_sequence(seq)
    fresh = session.open_sequence()  # the closed sequences' slots are free again
    assert torch.isfinite(session.run(session.new_step().add(fresh, [4]).build())).all()
    session.close_sequence(fresh)
