"""The EP1 dispatch/combine overhead bench on CPU with the tiny model: the 'without' graph has no exchange
ops and the same logits (dispatch and combine are the identity on one rank); both forms are timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsgraph.tools.bench.ep_overhead import measure
from tests.oracle import model_fixtures as fx


@pytest.mark.slow
def test_ep_overhead_bench_runs_both_forms(tmp_path: Path) -> None:
    cfg = fx.config(fx.checkpoint("tiny", str(tmp_path)), None)
    got = measure(cfg, (1,), "cpu", repeats=1, context=16)
    ops = got["exchange_ops_in_graph"]
    moes = ops["exchange"]["moe_experts"]
    assert moes > 0 and ops["no_exchange"]["moe_experts"] == moes
    assert ops["exchange"] == {"moe_experts": moes, "moe_dispatch": moes, "moe_combine": moes}
    assert ops["no_exchange"]["moe_dispatch"] == ops["no_exchange"]["moe_combine"] == 0
    assert [r["batch"] for r in got["decode"]] == [1]
    assert all(
        r["same_logits"] and r["ms_with_dispatch_combine"] > 0 and r["ratio"] > 0 for r in got["decode"]
    )
