"""L1: the step metadata of prefill truncation (SWA pivots, visible keys, ring store slots, compressed
key ranges) in off, mask and compact, from the real scheduler's plans and without weights. A KEEP below
the window must fail it: compact then leaves ring entries unwritten that the first decode step reads."""

from __future__ import annotations

from dataclasses import replace

from dsgraph.tools.truncation_l1 import L1Config, run_l1


def test_l1_tiny_geometry_mixed_batches_and_chunks() -> None:
    report = run_l1(L1Config())
    assert report.ok, report.as_text()
    assert report.truncated_steps >= 3
    # compact runs the decoder on fewer rows than mask and off, which run it on every row
    assert report.rows["compact"] < report.rows["mask"] == report.rows["off"]


def test_l1_v41_geometry() -> None:
    """Window 128, ring 134, KEEP 134 (V4.1 with 5 drafts); prompts of several chunks of 256."""
    cfg = L1Config(
        window=128,
        ring_len=134,
        keep=134,
        prompts=(700, 150, 400),
        budget=256,
        decode_steps=4,
        max_model_len=1024,
    )
    report = run_l1(cfg)
    assert report.ok, report.as_text()


def test_l1_with_prefix_hits() -> None:
    """Prompts sharing their tokens hit the prefix cache with a replay of one window: their chunks start
    at the replay start and attention reads no SWA key below it (seq_window_start > 0)."""
    report = run_l1(L1Config(replay=8, prompts=(40, 57, 31, 64), exempt=()))
    assert report.ok, report.as_text()
    assert report.replayed_seqs > 0


def test_l1_fails_when_keep_is_below_the_window() -> None:
    """KEEP 5 < window 8: every prefill check holds, but compact never wrote the decoder ring entries
    that the first decode steps read (mask wrote them from rows it ran with narrowed attention)."""
    report = run_l1(L1Config(keep=5))
    assert not report.ok
    assert report.mismatches, report.as_text()
    assert all(" compact: " in m and "reads ring position" in m for m in report.mismatches), report.as_text()


def test_l1_fails_when_a_mode_runs_truncated_rows() -> None:
    """A policy that keeps more rows in compact than mask narrows to is caught as a difference."""
    report = run_l1(replace(L1Config(), keep=20), policy_keep=14)  # checks expect 20, steps keep 14
    assert not report.ok


def test_truncation_check_command_l1(capsys) -> None:  # type: ignore[no-untyped-def]
    from dsgraph.tools.cli import main

    assert main(["truncation-check", "--level", "l1"]) == 0
    assert "OK" in capsys.readouterr().out
