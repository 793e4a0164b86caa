"""L2: teacher-forced log-probabilities after a truncated chunked prefill of a batch of prompts of
different lengths (tools/truncation_l2.py): mask equals compact bit for bit, log-probabilities and the
DSpark confidences drafted right after the prefill; both stay within the stated bound of off
(`prefill_truncation.BOUND_*`), and truncation really moved them (it is an approximation, not a no-op).
Measured (serving and reference numerics, tiny, tiny_select_all, wide): golden-token log-probs at most
0.053 nats from off, whole log-prob rows 0.15, confidences 0.24 (also the embedded model)."""

from __future__ import annotations

import pytest

from dsgraph.runtime.prefill_truncation import BOUND_CONFIDENCE, BOUND_LOGPROB_ROW, BOUND_NATS
from dsgraph.tools.truncation_l2 import L2Config, compare_l2, run_mode
from tests.oracle import model_fixtures as fx


@pytest.mark.parametrize(("name", "numerics"), [("tiny", "serving"), ("wide", "reference")])
def test_l2_mask_equals_compact_and_both_are_near_off(
    tmp_path_factory: pytest.TempPathFactory, name: str, numerics: str
) -> None:
    model_dir = fx.checkpoint(name, str(tmp_path_factory.getbasetemp()))
    c = L2Config(numerics=numerics)
    results = {m: run_mode(model_dir, m, c) for m in ("off", "mask", "compact")}
    figures = compare_l2(results)
    assert figures["truncated_steps"] > 0, figures
    assert figures["mask_equals_compact"], figures
    assert figures["confidence_mask_equals_compact"], figures
    assert 0 < figures["max_golden_logprob_diff_vs_off"] <= BOUND_NATS, figures
    assert figures["max_logprob_diff_vs_off"] <= BOUND_LOGPROB_ROW, figures
    assert 0 < figures["max_confidence_diff_vs_off"] <= BOUND_CONFIDENCE, figures
