"""Test fixtures that break one request inside the engine's model runner: poisoned logits (NaN/+inf as
the forward hands them on) or out-of-vocabulary samples, on the rows `rows(plan)` picks. Each returns
the undo; the engine itself holds no such hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Rows = Callable[[Any], list[int]]


def poison_logits(engine: Any, rows: Rows, column: int, value: float) -> Callable[[], None]:
    """The logits of `rows(plan)` get `value` in `column` after every forward (plain, overlapped and
    DSpark verify steps all pass through `ModelRunner.submit`)."""
    runner = engine.runner
    submit = runner.submit

    def bad(plan, fix=None):  # type: ignore[no-untyped-def]
        launched = submit(plan, fix)
        for i in rows(plan):
            launched.logits[i, column] = value
        return launched

    runner.submit = bad
    return lambda: runner.__dict__.pop("submit", None)


def poison_samples(engine: Any, rows: Rows, token: int) -> Callable[[], None]:
    """The samples of `rows(plan)` become `token` (plain and overlapped sampling)."""
    runner = engine.runner
    sample = runner._sample

    def bad(plan, logits, seqs, to_host=True):  # type: ignore[no-untyped-def]
        s = sample(plan, logits, seqs, to_host)
        for i in rows(plan):
            s.tokens[i] = token
        return s

    runner._sample = bad
    return lambda: runner.__dict__.pop("_sample", None)
