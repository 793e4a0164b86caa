"""Acceptance statistics (runtime/csrc/spec_stats.h) on hand-built verify outcomes."""

from __future__ import annotations

import numpy as np
import pytest

from dsgraph.runtime.spec_schedule import SpecStats


def two_steps() -> SpecStats:
    stats = SpecStats(nextn=5)
    # Step 1: request 0 verifies 3 and accepts 1; request 1 accepts both of 2; request 2 has no drafts.
    stats.record([3, 2, 0], [1, 2, 0], [[0.9, 0.8, 0.6], [0.55, 0.45], None])
    # Step 2: request 0 accepts all 5; request 1 rejects its only draft.
    stats.record([5, 1], [5, 0], [[0.95] * 5, [0.92]])
    return stats


def test_counts_and_rates() -> None:
    s = two_steps().snapshot()
    assert (s["steps"], s["sequences"], s["verified_tokens"], s["accepted_tokens"]) == (2, 5, 11, 8)
    assert s["accept_rate"] == pytest.approx(8 / 11)
    assert s["mean_accepted_len"] == pytest.approx(8 / 5)
    assert s["mean_verified_len"] == pytest.approx(11 / 5)
    assert s["verified_at"] == [4, 3, 2, 1, 1]
    assert s["reached_at"] == [4, 3, 1, 1, 1]  # step 1 request 0 never reached position 2
    assert s["accepted_at"] == [3, 2, 1, 1, 1]
    assert s["position_accept_rate"] == pytest.approx([3 / 4, 2 / 3, 1 / 2, 1, 1])
    assert s["position_conditional_rate"] == pytest.approx([3 / 4, 2 / 3, 1, 1, 1])


def test_calibration_uses_reached_drafts_only() -> None:
    s = two_steps().snapshot()
    # Pairs (q, outcome): (.9,1) (.8,0) (.55,1) (.45,1) (.95,1)x5 (.92,0); q=.6 was never reached.
    assert s["calibration_count"] == 10
    assert s["calibration_mae"] == pytest.approx((0.1 + 0.8 + 0.45 + 0.55 + 5 * 0.05 + 0.92) / 10)
    assert s["bin_count"] == [0, 0, 0, 0, 1, 1, 0, 0, 1, 7]
    assert s["bin_confidence"][9] == pytest.approx((0.9 + 5 * 0.95 + 0.92) / 7)
    assert s["bin_acceptance"][9] == pytest.approx(6 / 7)
    assert s["bin_acceptance"][4:6] == [1.0, 1.0] and s["bin_acceptance"][8] == 0.0
    assert s["bin_confidence"][0] is None and s["bin_acceptance"][0] is None
    # ECE: bin 9 weighs 7/10 * |6.57/7 - 6/7|; the single-pair bins weigh their own error / 10.
    assert s["calibration_ece"] == pytest.approx(0.057 + 0.08 + 0.045 + 0.055)


def test_empty_and_confidence_free_snapshots() -> None:
    stats = SpecStats(nextn=3, num_bins=4)
    s = stats.snapshot()
    assert s["steps"] == 0 and s["accept_rate"] is None and s["calibration_ece"] is None
    assert s["position_accept_rate"] == [None, None, None] and s["bin_count"] == [0, 0, 0, 0]
    stats.record([2, 0], [1, 0])
    s = stats.snapshot()
    assert s["accept_rate"] == 0.5 and s["calibration_count"] == 0 and s["calibration_mae"] is None
    assert s["position_accept_rate"] == [1.0, 0.0, None]
    stats.reset()
    assert stats.snapshot()["verified_tokens"] == 0


def test_confidence_one_falls_in_the_last_bin() -> None:
    stats = SpecStats(nextn=2, num_bins=4)
    stats.record([2], [2], [[1.0, 0.0]])  # q = 0 accepted: the worst calibration
    s = stats.snapshot()
    assert s["bin_count"] == [1, 0, 0, 1]
    assert s["calibration_mae"] == 0.5 and s["calibration_ece"] == 0.5


@pytest.mark.parametrize(
    ("verified", "accepted", "conf", "message"),
    [
        ([2, 3], [1, 4], None, r"request 1: accepted = 4 is outside 0..verified = 3"),
        ([6], [0], None, r"request 0: verified = 6 is outside 0..nextn = 5"),
        ([1], [1, 0], None, r"accepted has 2 entries; expected one per request \(1\)"),
        ([2], [1], [[0.5, 1.2]], r"request 0: confidence at position 1 = 1.2\d* is not in \[0, 1\]"),
        ([2], [1], np.zeros((1, 4)), r"confidences have shape \[1, 4\]; expected \[1, 5\]"),
    ],
)
def test_bad_records_name_the_request_and_change_nothing(
    verified: list[int], accepted: list[int], conf: object, message: str
) -> None:
    stats = two_steps()
    before = stats.snapshot()
    with pytest.raises(ValueError, match=message):
        stats.record(verified, accepted, conf)  # type: ignore[arg-type]
    assert stats.snapshot() == before


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match=r"SpecStats: nextn = 0 is not positive"):
        SpecStats(nextn=0)
    with pytest.raises(ValueError, match=r"SpecStats: num_bins = 0 is not positive"):
        SpecStats(nextn=5, num_bins=0)
