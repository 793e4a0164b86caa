"""Comparing a text with its golden file, or rewriting the file under `--update-goldens`.

A rewrite skips the test instead of passing it: a run that rewrote a golden checked nothing.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_DIFF_LINES = 120


def text_diff(want: str, got: str, want_name: str, got_name: str, max_lines: int = MAX_DIFF_LINES) -> str:
    """A unified diff of two texts, cut after `max_lines` lines (the cut is said)."""
    lines = list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), want_name, got_name, n=2))
    cut = lines[:max_lines]
    more = f"... {len(lines) - max_lines} more diff lines\n" if len(lines) > max_lines else ""
    return "".join(cut) + more


def check_golden(path: Path, text: str, update: bool) -> None:
    """`text` equals the file at `path`; with `update` the file is rewritten and the test skipped."""
    name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            pytest.skip(f"--update-goldens: rewrote {name}")
        pytest.skip(f"--update-goldens: {name} unchanged")
    if not path.exists():
        pytest.fail(f"{name} is missing: run pytest with --update-goldens and commit it", pytrace=False)
    want = path.read_text()
    if text != want:
        diff = text_diff(want, text, f"{name} (golden)", f"{name} (now)")
        pytest.fail(
            f"{name} differs from the current code; if the change is intended, rerun with "
            f"--update-goldens and commit the diff:\n{diff}",
            pytrace=False,
        )
