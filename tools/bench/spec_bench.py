"""DSpark decode throughput on the bench model (issue 6's benchmark).

Measured in the run: the target's verify step for B requests with k drafts each (B x (1+k) rows, k = 0..5,
captured like any step) and the draft pass for B requests, through the runtime's captured path (one CUDA
graph set per draft bucket, replayed: `draft_captured`; `draft_eager_ms` is the same pass run eagerly,
for comparison only); `draft_ms`, the captured pass, is what the policies below charge per drafting step.
The requests are greedy, so the pass runs the drafter's greedy variant (`draft_variant`; runtime/
spec_draft.py); `draft_full_ms` is the same pass through the full graph (sorted sampling, log-probs).
Random weights accept almost no draft, so the tokens per step come from a stated acceptance model:
per-position conditional acceptance probabilities p_1..p_5, with the confidence head assumed calibrated
(confidences = p). Expected tokens per request for k verified drafts: 1 + sum_{i<=k} prod_{j<=i} p_j
(exact for the model; not sampled). Policies:
- off: no drafting, B tokens per step of t(B, 0);
- fixed: every request verifies 5 drafts, plus one draft pass per step;
- confidence: the runtime's planner (`plan_verification`) on the measured curve (rows -> verify time)
  with the measured draft pass as the cost of drafting, choosing the drafts that maximise expected
  tokens per predicted step time, draft pass included; where no drafting plan beats `off` it verifies
  nothing and drafts nothing, so it never falls below `off`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from dsgraph.models.deepseek_v41.config import ModelConfig
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest
from dsgraph.models.deepseek_v41.model import V41Model
from dsgraph.runtime.spec_draft import DraftRunner
from dsgraph.runtime.spec_schedule import make_curve, plan_rate, plan_verification
from dsgraph.runtime.step_padding import bucket_size
from dsgraph.tools.bench.model_bench import fill_caches, make_model, session_for
from dsgraph.tools.bench.steps import decode_step
from dsgraph.tools.bench.timing import time_ms

ACCEPTANCE = {
    "synthetic_0.9_to_0.5": (0.9, 0.8, 0.7, 0.6, 0.5),
    "synthetic_0.6_flat": (0.6, 0.6, 0.6, 0.6, 0.6),
    "random_weights_0": (0.0, 0.0, 0.0, 0.0, 0.0),
}
MAX_DRAFTS = 5


def verify_step(model: V41Model, batch: int, context: int, k: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Request b: rows [newest token, d_0..d_{k-1}] at positions context-1 .. context-1+k, all sampled."""
    base = decode_step(model, batch, context + k, seed)  # block tables cover the verify rows
    rows = 1 + k
    rng = np.random.default_rng(seed)
    seqs = np.repeat(np.arange(batch, dtype=np.int32), rows)
    pos = (context - 1 + np.tile(np.arange(rows, dtype=np.int32), batch)).astype(np.int32)
    start = np.full(batch, context - 1, dtype=np.int32)
    return {
        **base,
        "token_ids": rng.integers(0, model.cfg.text.vocab_size, batch * rows, dtype=np.int32),
        "positions": pos,
        "seq_ids": seqs,
        "seq_start": start,
        "seq_end": start + rows,
        "sample_rows": np.arange(batch * rows, dtype=np.int32),
        "is_replay": np.zeros(batch * rows, dtype=np.int32),
    }


def expected_tokens(p: tuple[float, ...], k: int) -> float:
    return 1.0 + float(np.sum(np.cumprod(p)[:k])) if k else 1.0


def _policies(batch: int, t_verify: dict[int, float], t_draft: float, p: tuple[float, ...]) -> dict:
    sizes = [batch * (1 + k) for k in range(MAX_DRAFTS + 1)]
    curve = make_curve(sizes, [t_verify[k] for k in range(MAX_DRAFTS + 1)], lookup="step")
    plan = plan_verification([list(p)] * batch, curve, MAX_DRAFTS * batch, draft_ms=t_draft)
    fixed_tokens = batch * expected_tokens(p, MAX_DRAFTS)
    return {
        "off_tokens_per_s": batch / (t_verify[0] * 1e-3),
        "fixed5_tokens_per_s": fixed_tokens / ((t_verify[MAX_DRAFTS] + t_draft) * 1e-3),
        "confidence_tokens_per_s": plan_rate(plan) * 1e3,
        "confidence_drafts_per_request": plan.total_drafts / batch,
    }


def spec_case(
    model: V41Model, session: Any, runner: DraftRunner, full: DraftRunner, batch: int, context: int
) -> dict:
    t_verify = {
        k: time_ms(lambda k=k: session.run(verify_step(model, batch, context, k)), warmup=2, repeats=6)
        for k in range(MAX_DRAFTS + 1)
    }
    requests = [DraftRequest(anchor=1, position=context - 1, slot=b) for b in range(batch)]
    t_draft = time_ms(lambda: runner.run(requests), warmup=2, repeats=6)
    captured = runner.captured.get(runner.key(bucket_size(batch), runner.greedy_variant(requests)))
    t_eager = time_ms(lambda: runner.run(requests, capture=False), warmup=1, repeats=5)
    row: dict[str, Any] = {"batch": batch, "context": context, "verify_ms": t_verify, "draft_ms": t_draft}
    row.update(
        draft_variant="greedy" if runner.greedy_variant(requests) else "full",
        draft_full_ms=time_ms(lambda: full.run(requests), warmup=2, repeats=6),
        draft_captured=captured is not None,
        draft_eager_ms=t_eager,
        draft_captures=runner.draft_captures,  # one per bucket: the repeats replayed
        draft_graphs=captured.num_graphs if captured is not None else 0,
        draft_eager_steps=captured.num_eager if captured is not None else None,
    )
    row["acceptance_models"] = {
        name: {"p": p, **_policies(batch, t_verify, t_draft, p)} for name, p in ACCEPTANCE.items()
    }
    return row


def spec_cases(
    cfg: ModelConfig, weights: Mapping[str, Tensor], batches: tuple[int, ...], context: int = 8192
) -> list[dict[str, Any]]:
    model = make_model(cfg, context + 64, dspark=True)
    session = session_for(model, weights, max(batches), context + MAX_DRAFTS + 1)
    fill_caches(session)
    runner = DraftRunner(session, weights)
    full = DraftRunner(session, weights, greedy_variant=False)  # the same pass through the full graph
    rows = []
    for b in batches:
        try:
            rows.append(spec_case(model, session, runner, full, b, context))
        except Exception as exc:  # one batch failing must not end the bench
            rows.append({"batch": b, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return rows
