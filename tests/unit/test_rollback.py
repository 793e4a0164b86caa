"""Rollback of a verify step is only the committed length (spec 7.3; DeepInfer rolls back the same way).

A drafted request runs rounds of verify steps: rows [anchor, d_0 .. d_{k-1}] with random drafts, of which
a random number n is accepted (committed length a + 1 + n), then the next anchor. A reference request
that never drafts runs the committed rows only. After every round, every cache of the drafted request,
restricted to what a later step can read, equals the reference's, and the logits of the committed rows
(and so of every later step) are the same bits:

- SWA ring `swa.{i}`: entries of the window positions c - window .. c - 1 (the ring has ROLLBACK_ROOM
  spare entries, so the rejected positions, at most 5 past c, land on entries older than the window);
- compressed `ckv.{i}` / `kidx.{i}`: entries of groups closed below the committed length (entries
  written for rejected rows are rewritten when their positions run again, before anything reads them);
- compressor state `comp.{i}`: the ring entry of position c - 1 when c is odd (the open group's first
  token, the only entry a later step reads).

Without the spare room (ring = window, compressor ring 1) the same check fails: the test has power.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsgraph.models.deepseek_v41 import step_io
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import REFERENCE
from dsgraph.models.deepseek_v41.step_io import CacheGeometry, default_geometry
from dsgraph.models.deepseek_v41.weights import prepare_weights
from dsgraph.runtime.step_runner import StepRunner
from tests.oracle import model_fixtures as fx
from tests.unit.test_spec_sampling_refs import Seq, run_verify

DRAFTED, REFERENCE_RID = 0, 1
MAX_DRAFTS = step_io.ROLLBACK_ROOM - 1  # anchor + 5 drafts
VOCAB = 256  # the tiny config's vocabulary


def _runner(root: Path, geometry: CacheGeometry | None = None) -> StepRunner:
    model_dir = fx.checkpoint("tiny", str(root))
    cfg = fx.config(model_dir, None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    geo = geometry or default_geometry(cfg.text, fx.MAX_MODEL_LEN, fx.PAGE_SIZE)
    weights = prepare_weights(cfg, fx._stored(model_dir), REFERENCE, token_map)
    return StepRunner(build_model(cfg, token_map, REFERENCE, geo), weights, num_slots=4, num_pages=32)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> StepRunner:
    return _runner(tmp_path_factory.getbasetemp() / "rollback")


def readable(runner: StepRunner, rid: int) -> dict[str, torch.Tensor]:
    """The parts of request `rid`'s caches that a step after its committed length can read."""
    req, model = runner.requests[rid], runner.model
    c, window, geo = len(req.tokens), model.cfg.text.sliding_window, model.geo
    out = {}
    for name, t in model.cache_types().items():
        cache = runner.caches[name]
        if name.startswith("swa."):
            out[name] = cache[req.slot, torch.arange(max(0, c - window), c) % cache.shape[1]]
        elif name.startswith("comp."):
            out[name] = cache[req.slot, (c - 1) % cache.shape[1]] if c % 2 else cache.new_zeros(0)
        else:  # a paged cache of ratio r: entries of the groups closed below c
            ratio = int(str(t.shape[0]).removeprefix("blocks"))
            entries = torch.arange(c // ratio)
            pages = torch.tensor(req.pages.get(ratio, []), dtype=torch.long)
            out[name] = cache[pages[entries // geo.page_size], entries % geo.page_size]
    return out


def _mismatches(runner: StepRunner) -> list[str]:
    drafted, reference = readable(runner, DRAFTED), readable(runner, REFERENCE_RID)
    return [name for name in drafted if not torch.equal(drafted[name], reference[name])]


Round = tuple[list[int], int]  # (drafts followed by the next anchor, accepted count)


def play(runner: StepRunner, prompt: list[int], rounds: list[Round]) -> list[str]:
    """Run the script on a drafted and a reference request; returns what differed (empty: nothing)."""
    for rid in (DRAFTED, REFERENCE_RID):
        runner.add(rid)
    problems: list[str] = []
    try:
        runner.step([(DRAFTED, prompt[:-1]), (REFERENCE_RID, prompt[:-1])])
        anchor = prompt[-1]
        for i, (tokens, accepted) in enumerate(rounds):
            drafts, n = tokens[:-1], min(accepted, len(tokens) - 1)
            committed = len(runner.requests[DRAFTED].tokens) + 1 + n
            got, want = runner.step([(DRAFTED, [anchor, *drafts]), (REFERENCE_RID, [anchor, *drafts[:n]])])
            runner.rollback(DRAFTED, committed)
            if not torch.equal(got[: n + 1], want):
                problems.append(f"round {i}: logits of the committed rows")
            problems += [f"round {i}: cache {name}" for name in _mismatches(runner)]
            anchor = tokens[-1]
        got, want = runner.step([(DRAFTED, [anchor]), (REFERENCE_RID, [anchor])])  # continued decoding
        if not torch.equal(got, want):
            problems.append("the decode step after the last round: logits")
    finally:
        for rid in (DRAFTED, REFERENCE_RID):
            runner.release(rid)
    return problems


token = st.integers(0, VOCAB - 1)
rounds = st.lists(
    st.tuples(st.lists(token, min_size=1, max_size=MAX_DRAFTS + 1), st.integers(0, MAX_DRAFTS)),
    min_size=1,
    max_size=5,
)
# A prompt of 21 tokens puts the anchor at the even position 20; five drafts all rejected commit 21 (odd),
# so the next step reads the compressor state of position 20 and the SWA window 13 .. 20.
PROMPT = list(range(3, 24))
WORST = [([7, 8, 9, 10, 11, 12], 0)]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(token, min_size=2, max_size=24), script=rounds)
@example(prompt=PROMPT, script=WORST + [([1, 2, 3, 4, 5, 6], 3), ([9, 9, 9, 9, 9, 9], 5)])
def test_rollback_leaves_what_later_steps_read_equal_to_never_drafting(
    runner: StepRunner, prompt: list[int], script: list[Round]
) -> None:
    assert play(runner, prompt, script) == []


@pytest.mark.parametrize("broken", ["swa_ring_without_room", "compressor_ring_of_one"])
def test_without_the_spare_room_rollback_breaks(
    broken: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path_factory.getbasetemp() / "rollback"
    geometry = None
    if broken == "swa_ring_without_room":
        geometry = CacheGeometry(8, fx.PAGE_SIZE, fx.MAX_MODEL_LEN)  # the tiny window, no spare entries
    else:
        monkeypatch.setattr(step_io, "COMPRESSOR_RING", 1)
    problems = play(_runner(root, geometry), PROMPT, WORST)
    kind = "swa." if geometry else "comp."
    assert any(kind in p for p in problems), problems


def test_greedy_with_drafting_equals_greedy_without(runner: StepRunner) -> None:
    """Greedy decoding through verify steps (drafts: the right continuation with one token corrupted at a
    random place, or all right) and `spec_verify`, rolled back to each committed length, emits the tokens
    of one-token greedy decoding."""
    prompt, steps, gen = PROMPT[:13], 10, torch.Generator().manual_seed(8)
    runner.add(REFERENCE_RID)
    try:
        logits = runner.step([(REFERENCE_RID, prompt)])[0][-1:]
        want: list[int] = []
        for _ in range(steps + MAX_DRAFTS + 1):
            want.append(run_verify([Seq(logits, [], temperature=0.0)])[0].tokens[0])
            logits = runner.step([(REFERENCE_RID, want[-1:])])[0]
    finally:
        runner.release(REFERENCE_RID)
    runner.add(DRAFTED)
    try:
        logits = runner.step([(DRAFTED, prompt[:-1])])[0]
        got, anchor, accepted = [], prompt[-1], 0
        while len(got) < steps:
            drafts = list(want[len(got) : len(got) + MAX_DRAFTS])
            wrong = int(torch.randint(MAX_DRAFTS + 1, (1,), generator=gen))
            if wrong < len(drafts):
                drafts[wrong] = (drafts[wrong] + 1) % VOCAB
            committed = len(runner.requests[DRAFTED].tokens) + 1
            out = run_verify([Seq(runner.step([(DRAFTED, [anchor, *drafts])])[0], drafts, temperature=0.0)])[
                0
            ]
            runner.rollback(DRAFTED, committed + out.num_accepted)
            got += out.tokens
            anchor, accepted = out.tokens[-1], accepted + out.num_accepted
    finally:
        runner.release(DRAFTED)
    assert got == want[: len(got)]
    assert accepted >= steps // 2, "the drafts should mostly be accepted"
