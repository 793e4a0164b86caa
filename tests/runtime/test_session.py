"""Session: programs lowered once per bucket, caches sized from a byte budget with clear errors."""

from __future__ import annotations

import pytest

from dsgraph.models.deepseek_v41.numerics import REFERENCE
from dsgraph.runtime.session import CacheBudgetError, _bytes_per, size_caches
from tests.oracle import model_fixtures as fx


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    r = fx.runner(fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp())), REFERENCE)
    for rid in range(3):
        r.add(rid)
    return r


def test_no_relowering_for_a_repeated_bucket(runner) -> None:  # type: ignore[no-untyped-def]
    session = runner.session
    runner.step([(0, [5, 6, 7])])
    built = session.programs_built
    runner.step([(1, [8, 9, 10])])  # same bucket: 3 rows, 1 sequence, 3 sampled rows
    assert session.programs_built == built
    runner.step([(0, [11]), (1, [12]), (2, [13])])  # a new bucket: 3 rows, 3 sequences
    assert session.programs_built == built + 1
    runner.step([(0, [14]), (1, [15]), (2, [16])])
    assert session.programs_built == built + 1


def test_cache_budget_split_and_error(runner) -> None:  # type: ignore[no-untyped-def]
    model = runner.model
    slot, page1, page2 = (_bytes_per(model, d) for d in ("slots", "blocks1", "blocks2"))
    assert slot > 0 and page1 > 0 and page2 > 0
    sizes = size_caches(model, 4, 4 * slot + 1000 * (2 * page1 + page2))
    assert sizes.num_pages[1] == 2 * sizes.num_pages[2]  # both ratios cover the same number of tokens
    assert sizes.num_slots == 4
    with pytest.raises(CacheBudgetError, match=r"cache budget 1000 B: .* max_model_len 512 needs \d+ B"):
        size_caches(model, 4, 1000)
