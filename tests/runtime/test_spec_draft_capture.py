"""The DSpark draft pass captured per bucket (runtime/spec_draft.py) on the cuda platform with a cpu
device, where a captured piece re-runs its steps into the buffers recorded at capture
(platform/cuda/capture.py): over several passes and buckets the captured drafts, confidences and draft
log-probs equal the eager pass's bit for bit, a repeated bucket is never captured again, `capture=False`
stays eager, and the in-graph `sample` and `sampling_logprobs` steps are captured (no eager piece).

The platform is the cuda platform without its Triton kernels (`target.DEFAULTS`: the cpu rules on device
tensors) because Triton's interpreter makes one tiny draft pass take tens of seconds; its moe_experts
rule stays eager here, so the split into graphs and eager pieces is exercised too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dsgraph.models.deepseek_v41.dspark_io import DraftRequest
from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.platform.cuda.capture import capturable
from dsgraph.platform.cuda.target import DEFAULTS
from dsgraph.runtime.engine_config import CudaConfig
from dsgraph.runtime.session import CacheSizes, Session
from dsgraph.runtime.spec_draft import DraftOutput, DraftRunner
from dsgraph.tools.bench.model_bench import fill_caches
from dsgraph.tools.bench.steps import pages_for
from tests.oracle import model_fixtures as fx

SLOTS, CONTEXT = 3, 96


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, torch.Tensor]]:
    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    cfg = fx.config(Path(model_dir), None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 128, 16), dspark=True)
    return model, random_serving_weights(cfg, token_map, device="cpu", dspark=True)


def session(parts: tuple[Any, dict[str, torch.Tensor]], *, capture: bool) -> Session:
    model, weights = parts
    pages = {r: SLOTS * pages_for(model, r, CONTEXT) for r in ratios(model.plans)}
    s = Session(
        model,
        weights,
        CacheSizes(SLOTS, pages),
        platform=DEFAULTS,
        device="cpu",
        cuda=CudaConfig(capture=capture),
    )
    assert s.runner.pads  # the cuda runner (eager or captured), not the cpu platform's interpreter
    fill_caches(s)  # context rings of random, finite keys
    return s


def requests(n: int, step: int) -> list[DraftRequest]:
    """n requests that differ in every field between passes: greedy and sampled rows, several slots."""
    return [
        DraftRequest(
            anchor=(37 * step + 11 * i) % 200 + 1,
            position=60 + 3 * step + i,
            slot=(step + i) % SLOTS,
            window_start=i % 2,
            temperature=0.0 if (step + i) % 3 == 0 else 0.7 + 0.1 * i,
            top_p=0.9 if i % 2 else 1.0,
            top_k=0 if i % 2 else 20,
            min_p=0.05 * (step % 2),
            seed=1000 * step + i,
        )
        for i in range(n)
    ]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (NaN and -inf compare exactly)."""
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def assert_same(got: DraftOutput, want: DraftOutput, where: str, fields: tuple[str, ...] = ()) -> None:
    for field in fields or ("tokens", "confidence", "logprobs"):
        a, b = getattr(got, field), getattr(want, field)
        if a is None or b is None:  # a greedy pass has no log-probabilities, on both paths
            assert a is None and b is None, f"{where} {field}: {a is None} vs {b is None}"
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, f"{where} {field}: {a.shape} vs {b.shape}"
        assert torch.equal(bits(a), bits(b)), f"{where} {field}: differs"


def copied(out: DraftOutput) -> DraftOutput:
    """The output with its log-probabilities copied (on the captured path a view of a static buffer)."""
    return DraftOutput(out.tokens, None if out.logprobs is None else out.logprobs.clone(), out.confidence)


def test_captured_drafts_equal_eager_bit_for_bit(parts: tuple[Any, dict[str, torch.Tensor]]) -> None:
    s = session(parts, capture=True)
    runner = DraftRunner(s, parts[1])
    assert runner.capture
    eager = DraftRunner(s, parts[1], capture=False)
    tokens = []
    # buckets 1 (pass 0: its one request is greedy, the greedy variant), 4, 2, then each again; pass 4's
    # single request samples: bucket 1 of the full graph, new; pass 7 repeats pass 0
    new = {0, 1, 2, 4}
    for step, n in enumerate([1, 3, 2, 3, 1, 4, 2, 1]):
        reqs = requests(n, 0 if step == 7 else step)
        got = copied(runner.run(reqs))
        assert runner.last_captured == (step in new)
        assert_same(got, eager.run(reqs), f"pass {step} ({n} requests)")
        assert got.tokens.shape == (n, s.model.cfg.text.dspark_block_size)
        assert (got.logprobs is None) == all(r.temperature == 0 for r in reqs)
        tokens.append(got.tokens)
        if step == 2:
            assert runner.draft_captures == 3 and set(runner.captured) == {(1, "greedy"), 2, 4}
    assert runner.draft_captures == 4  # repeated buckets replayed, never recaptured
    assert set(runner.captured) == {(1, "greedy"), 1, 2, 4}
    assert eager.draft_captures == 0 and not eager.captured
    assert len({tuple(t.flatten().tolist()) for t in tokens}) > 1  # the passes drafted different tokens
    assert s.captures == 0  # draft captures are the runner's, not the target's


def test_capture_flag_of_the_session_keeps_drafting_eager(parts: tuple[Any, dict[str, torch.Tensor]]) -> None:
    runner = DraftRunner(session(parts, capture=False), parts[1])
    out = runner.run(requests(2, 5))
    assert not runner.capture and runner.draft_captures == 0 and not runner.captured
    assert bool(torch.isfinite(out.confidence).all())


def test_sampling_steps_of_the_draft_are_captured(parts: tuple[Any, dict[str, torch.Tensor]]) -> None:
    runner = DraftRunner(session(parts, capture=True), parts[1])
    runner.run(requests(1, 1))  # a sampled request: the full graph
    steps = runner.captured[1].program.program.steps
    for op in ("sample", "sampling_logprobs", "draft_attention"):
        found = [i for i, st in enumerate(steps) if st.eqn.op == op]
        assert found, f"the draft graph has no {op} step"
        for i in found:
            ok, why = capturable(steps[i])
            assert ok, f"draft step {i} ({op}) is not capturable: {why}"
    eager_ops = {steps[i].eqn.op for ok, idx in runner.captured[1].runs if not ok for i in idx}
    # without the Triton kernels only the moe_experts cpu rule (nonzero: a data-dependent shape) runs
    # between the graphs; on the full cuda platform its kernel is captured too
    assert eager_ops <= {"moe_experts"}, runner.as_text()


def test_greedy_variant_drafts_what_the_full_graph_drafts(parts: tuple[Any, dict[str, torch.Tensor]]) -> None:
    """Greedy requests only: the greedy variant (one argmax per slot, no log-probabilities) gives the full
    graph's tokens and confidences bit for bit, eager and captured; a pass with one sampled request runs
    the full graph."""
    s = session(parts, capture=True)
    variant, full = DraftRunner(s, parts[1]), DraftRunner(s, parts[1], greedy_variant=False)
    for step, n in enumerate([1, 3, 4, 2]):
        reqs = [r.__class__(**{**_fields(r), "temperature": 0.0}) for r in requests(n, step)]
        want = full.run(reqs, capture=False)
        assert want.logprobs is not None  # the full graph always computes them
        for capture in (False, True):
            got = variant.run(reqs, capture=capture)
            assert got.logprobs is None
            assert_same(got, want, f"pass {step} capture={capture}", ("tokens", "confidence"))
    assert set(variant.programs) == {(1, "greedy"), (2, "greedy"), (4, "greedy")}
    mixed = requests(3, 1)  # sampled and greedy rows
    assert variant.run(mixed).logprobs is not None and 4 in variant.programs


def _fields(r: DraftRequest) -> dict[str, Any]:
    return {f: getattr(r, f) for f in r.__slots__}


def test_a_dead_row_drafts_minus_one_in_every_slot(parts: tuple[Any, dict[str, torch.Tensor]]) -> None:
    """A row with no finite logit (here a NaN Markov head: every row dead) draws -1 in its first slot; the
    later slots look up embedding row 0 instead of indexing the table with -1 (which raised, and on a GPU
    is an out-of-bounds read; a capture's all-padding warm-up step met it), and draw -1 again. Greedy
    variant and full graph, eager, checked."""
    model, weights = parts
    last = f"mtp.{model.cfg.text.num_nextn_predict_layers - 1}.markov_head.head.weight"
    dead = {**weights, last: torch.full_like(weights[last], float("nan"))}
    s = session((model, dead), capture=False)
    for variant in (True, False):
        out = DraftRunner(s, dead, greedy_variant=variant).run(requests(2, 1))
        assert bool((out.tokens == -1).all()), out.tokens
