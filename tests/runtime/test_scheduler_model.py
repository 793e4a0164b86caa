"""The scheduler's step plans run the tiny V4.1 model: same inputs as the Python step runner, greedy
outputs equal to cold full-prefill runs (mixed decode/prefill steps, chunked prefill, bucket padding,
preemption), a prefix-cache hit in `exact` replay mode reproduces a cold run bit for bit, and one in
`window` mode is deterministic (reads no SWA key below the replay start) though not exact.

Controls run the model with a plan's marks hidden: `skip_replay_writes=False` zeroes `is_replay` (replayed
rows then overwrite shared compressed pages) and `mask_window=False` zeroes `seq_window_start` (attention
then reads whatever the reused slot's ring holds below the replay start).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import V41Model, build_model, trace_step
from dsgraph.models.deepseek_v41.numerics import numerics_for
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.models.deepseek_v41.weights import prepare_weights, weight_types
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.interpret import run_graph
from dsgraph.runtime.scheduler import Scheduler, SchedulerConfig, StepPlan, model_inputs
from tests.oracle import model_fixtures as fx

NUM = numerics_for("reference")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def tiny(model_dir: Path) -> tuple[V41Model, dict[str, torch.Tensor]]:
    cfg = fx.config(model_dir, None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    model = build_model(cfg, token_map, NUM, default_geometry(cfg.text, fx.MAX_MODEL_LEN, fx.PAGE_SIZE))
    weights = prepare_weights(cfg, fx._stored(model_dir), NUM, token_map)
    return model, {k: v for k, v in weights.items() if not k.startswith("mtp.")}


class PlanExecutor:
    """Runs step plans on the cpu platform, carrying the caches between steps."""

    def __init__(
        self,
        model: V41Model,
        weights: dict[str, torch.Tensor],
        *,
        num_slots: int,
        num_pages: int,
        skip_replay_writes: bool = True,
        mask_window: bool = True,
    ) -> None:
        self.skip, self.mask_window = skip_replay_writes, mask_window
        self.graph = trace_step(model, weight_types(weights))
        self.weights = {f"weights.{k}": v for k, v in weights.items()}
        sizes = {"slots": num_slots, **{f"blocks{r}": num_pages for r in ratios(model.plans)}}
        self.caches = {
            name: torch.zeros([sizes.get(d, d) for d in t.shape], dtype=to_torch(t.dtype))  # type: ignore[misc]
            for name, t in model.cache_types().items()
        }

    def run(self, plan: StepPlan) -> torch.Tensor:
        step = {f"step.{k}": torch.tensor(v) for k, v in model_inputs(plan).items()}
        if not self.skip:  # control: hide the replay marks, so replayed rows write the shared pages
            step["step.is_replay"] = torch.zeros_like(step["step.is_replay"])
        if not self.mask_window:  # control: attention reads the ring below the replay start
            step["step.seq_window_start"] = torch.zeros_like(step["step.seq_window_start"])
        caches = {f"caches.{k}": v for k, v in self.caches.items()}
        out = run_graph(self.graph, {**self.weights, **caches, **step})
        for name in self.caches:
            if f"caches.{name}" in out:
                self.caches[name] = out[f"caches.{name}"]
        return out["logits"]


def drive(ex: PlanExecutor, sched: Scheduler) -> Iterator[tuple[StepPlan, torch.Tensor, list]]:
    """Greedy steps until every request finished; yields each plan, its logits and events."""
    for _ in range(500):
        if not sched.has_unfinished:
            return
        plan = sched.schedule()
        logits = ex.run(plan) if plan.bucket else torch.zeros(0, 1)
        events = sched.update(np.asarray(torch.argmax(logits, -1), dtype=np.int32))
        yield plan, logits, events
    raise AssertionError("requests did not finish in 500 steps")


def cold_logits(model_dir: Path, tokens: list[int]) -> torch.Tensor:
    """Logits of every position of `tokens` from one full prefill on a fresh step runner."""
    runner = fx.runner(model_dir, NUM, num_slots=2, num_pages=32)
    runner.add(0)
    return runner.step([(0, tokens)])[0]


def test_plan_arrays_equal_step_runner_inputs(model_dir: Path, tiny: Any) -> None:
    model, _ = tiny
    runner = fx.runner(model_dir, NUM, num_slots=4, num_pages=32)
    runner.add(0)
    config = SchedulerConfig.for_model(model, num_pages=32, num_slots=4, max_num_batched_tokens=16)
    sched = Scheduler(config)
    prompt = fx.prompt(3, 37)
    sched.add_request(0, prompt, max_tokens=4)
    tokens = list(prompt)
    starts = []
    while sched.has_unfinished:
        plan = sched.schedule()
        start, end = int(plan.seq_start[0]), int(plan.seq_end[0])
        starts.append(start)
        want = runner.step_inputs([(0, tokens[start:end])])
        got = model_inputs(plan)
        n = plan.num_tokens
        for name, value in want.items():
            if name == "sample_rows":  # the runner samples every row; the plan only the newest token's
                continue
            row_input = name in ("token_ids", "positions", "seq_ids", "is_replay")
            assert np.array_equal(got[name][:n] if row_input else got[name], value.numpy()), name
        assert plan.sample_rows.tolist() == ([n - 1] if end == len(tokens) else [])
        logits = runner.step([(0, tokens[start:end])])[0]
        token = int(torch.argmax(logits[-1]))
        events = sched.update(np.asarray([token] * len(plan.sample_rows), dtype=np.int32))
        tokens += [e.token for e in events]
    assert starts == [0, 16, 32, 37, 38, 39]  # three prefill chunks, then decode rows


def test_scheduled_greedy_equals_cold_runs(model_dir: Path, tiny: Any) -> None:
    model, weights = tiny
    # 4 pages per ratio cannot hold all three requests at once: the youngest is preempted and recomputed.
    config = SchedulerConfig.for_model(
        model, num_pages=4, num_slots=3, max_num_seqs=3, max_num_batched_tokens=16, enable_prefix_cache=False
    )
    sched = Scheduler(config)
    prompts = {0: fx.prompt(11, 37), 1: fx.prompt(12, 5), 2: fx.prompt(13, 20)}
    for rid, p in prompts.items():
        sched.add_request(rid, p, max_tokens=14)
    outputs: dict[int, list[int]] = {rid: [] for rid in prompts}
    mixed = padded = False
    ex = PlanExecutor(model, weights, num_slots=3, num_pages=4)
    for plan, _logits, events in drive(ex, sched):
        mixed |= 0 < plan.num_decode < plan.num_seqs
        padded |= plan.bucket > plan.num_tokens
        for e in events:
            outputs[e.rid].append(e.token)
    assert mixed and padded and sched.native.num_preemptions > 0
    for rid, p in prompts.items():
        seq = p + outputs[rid]
        assert len(outputs[rid]) == 14
        want = torch.argmax(cold_logits(model_dir, seq[:-1])[len(p) - 1 :], -1).tolist()
        assert outputs[rid] == want, rid


def test_padding_rows_change_nothing(tiny: Any) -> None:
    model, weights = tiny
    outs = []
    for buckets in ((24,), (64,)):
        sched = Scheduler(
            SchedulerConfig.for_model(model, num_pages=8, buckets=buckets, max_num_batched_tokens=24)
        )
        sched.add_request(0, fx.prompt(5, 19), max_tokens=2)
        sched.add_request(1, fx.prompt(6, 5), max_tokens=2)
        ex = PlanExecutor(model, weights, num_slots=8, num_pages=8)
        plan = sched.schedule()
        assert (plan.bucket, plan.num_tokens) == (buckets[0], 24)
        outs.append((ex.run(plan), ex.caches))
    (logits_a, caches_a), (logits_b, caches_b) = outs
    assert torch.equal(logits_a, logits_b)
    for name in caches_a:
        assert torch.equal(caches_a[name], caches_b[name]), name


def run_prefix_hit(
    tiny: Any, replay: str, num_slots: int, skip: bool, *, poison: bool = False, mask_window: bool = True
) -> tuple[Scheduler, list, list[int]]:
    """A 70-token prompt runs, then a second prompt sharing its first 64 tokens hits the prefix cache.
    `poison`: fill every SWA ring with random bytes before the hit (a reused slot's stale keys)."""
    model, weights = tiny
    config = SchedulerConfig.for_model(
        model, num_pages=12, replay=replay, num_slots=num_slots, max_num_seqs=1, max_num_batched_tokens=32
    )
    sched = Scheduler(config)
    ex = PlanExecutor(
        model, weights, num_slots=num_slots, num_pages=12, skip_replay_writes=skip, mask_window=mask_window
    )
    first = fx.prompt(21, 70)
    sched.add_request(0, first, max_tokens=2)
    list(drive(ex, sched))
    if poison:
        gen = torch.Generator().manual_seed(23)
        for name, ring in ex.caches.items():
            if name.startswith("swa."):
                ex.caches[name] = torch.randint(0, 256, ring.shape, dtype=torch.uint8, generator=gen)
    second = first[:64] + fx.prompt(22, 10)
    sched.add_request(1, second, max_tokens=3)
    return sched, list(drive(ex, sched)), second


@pytest.mark.parametrize("num_slots", [1, 2])  # 1: the second request reuses the first one's slot
def test_exact_prefix_hit_equals_a_cold_run(model_dir: Path, tiny: Any, num_slots: int) -> None:
    model, _ = tiny
    sched, plans, second = run_prefix_hit(tiny, "exact", num_slots, skip=True)
    assert (
        sched.config.replay_tokens == model.cfg.text.sliding_window * model.cfg.text.num_hidden_layers == 48
    )
    assert sched.native.prefix_hit_tokens == 64  # grain lcm(16 * 1, 16 * 2) = 32: two grains
    first_plan = plans[0][0]
    assert int(first_plan.seq_start[0]) == 64 - 48
    assert first_plan.is_replay[: first_plan.num_tokens].tolist() == [1] * 32  # rows 16..47 of 16..63
    assert sched.native.num_replayed_tokens == 48
    cold = cold_logits(model_dir, second)
    sampled = [logits for plan, logits, _ in plans if len(plan.sample_rows)]
    assert torch.equal(sampled[0][0], cold[len(second) - 1])
    outputs = [e.token for _, _, events in plans for e in events]
    want = torch.argmax(cold_logits(model_dir, second + outputs[:-1])[len(second) - 1 :], -1).tolist()
    assert outputs == want


def test_unmasked_replay_rows_are_not_exact(model_dir: Path, tiny: Any) -> None:
    """Control for the test above: letting replay rows overwrite the shared cached entries corrupts them."""
    _, plans, second = run_prefix_hit(tiny, "exact", 2, skip=False)
    first_sampled = next(logits for plan, logits, _ in plans if len(plan.sample_rows))
    assert not torch.equal(first_sampled[0], cold_logits(model_dir, second)[-1])


def _sampled(plans: list) -> list[torch.Tensor]:
    return [logits for plan, logits, _ in plans if len(plan.sample_rows)]  # the model returns sampled rows


def test_window_replay_is_deterministic_but_approximate(model_dir: Path, tiny: Any) -> None:
    """Window replay starts one window before the hit (64 - 8 = 56, a group boundary of every ratio);
    attention reads no SWA key below that start, so a fresh slot, a reused slot and a slot full of random
    bytes give the same logits bit for bit. The replayed rows' truncated windows make it differ from a
    cold run."""
    sched, fresh, second = run_prefix_hit(tiny, "window", 2, skip=True)
    assert sched.config.replay_tokens == 8 and sched.native.prefix_hit_tokens == 64
    assert [int(plan.seq_start[0]) for plan, _, _ in fresh] == [56, 74, 75]  # replay + prompt, 2 decodes
    assert all(plan.seq_window_start.tolist() == [56] for plan, _, _ in fresh)  # prefill and decode steps
    runs = {
        "reused": run_prefix_hit(tiny, "window", 1, skip=True)[1],
        "poisoned": run_prefix_hit(tiny, "window", 1, skip=True, poison=True)[1],
    }
    want = _sampled(fresh)
    assert len(want) == 3
    for name, plans in runs.items():
        assert all(plan.seq_window_start.tolist() == [56] for plan, _, _ in plans), name
        got = _sampled(plans)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), name
    assert not torch.equal(want[0][0], cold_logits(model_dir, second)[-1])
    # Control: with the window start hidden, the poisoned ring's bytes reach the logits.
    unmasked = run_prefix_hit(tiny, "window", 1, skip=True, poison=True, mask_window=False)[1]
    assert not torch.equal(_sampled(unmasked)[0], want[0])
