"""Test fixtures that break one request inside the engine's model runner: poisoned logits (NaN/+inf as
the forward hands them on) or out-of-vocabulary samples, on the rows `rows(plan)` picks (each returns the
undo); and `draft_hook`, which replaces DSpark drafts. The engine itself holds no such hook: they wrap
the instance's methods."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from dsgraph.runtime.spec_draft import DraftOutput

Rows = Callable[[Any], list[int]]
# (rid, position of the anchor, drafts, confidences) -> replacement (drafts, confidences) or None
DraftFn = Callable[[int, int, list[int], list[float]], tuple[list[int], list[float]] | None]


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


class DraftHook:
    """Replaces the drafts of each drafted sequence by `fn(rid, anchor position, drafts, confidences)`
    (None keeps them) as the drafter hands them on; a replaced draft gets a one-hot draft distribution
    so exact verification stays exact, and fewer drafts than the drafter's are cut with an invalid id
    (the drafting path drops drafts from the first id outside the vocabulary on)."""

    def __init__(self, spec: Any) -> None:
        self.fn: DraftFn | None = None
        self._spec, self._rids = spec, {}
        draft, run = spec.draft, spec.drafter.run

        def draft_noting_slots(plan, v, seqs):  # type: ignore[no-untyped-def]
            self._rids = {int(plan.seq_slot[k]): s.rid for k, s in enumerate(seqs) if s is not None}
            return draft(plan, v, seqs)

        def run_replaced(requests, **kw):  # type: ignore[no-untyped-def]
            out = run(requests, **kw)
            return out if self.fn is None else self._replace(requests, out)

        spec.draft, spec.drafter.run = draft_noting_slots, run_replaced

    def _replace(self, requests: Any, out: DraftOutput) -> DraftOutput:
        assert self.fn is not None
        tokens = out.tokens.clone()
        logprobs = None if out.logprobs is None else out.logprobs.clone()
        conf = out.confidence.double().clamp(0, 1)
        width = min(self._spec.nextn, tokens.shape[1])
        for i, req in enumerate(requests):
            rid = self._rids.get(req.slot)
            got = (
                None
                if rid is None
                else self.fn(rid, req.position, tokens[i, :width].tolist(), conf[i, :width].tolist())
            )
            if got is None:
                continue
            d, c = list(got[0])[:width], list(got[1])[:width]
            tokens[i], conf[i] = -1, 0.0
            tokens[i, : len(d)], conf[i, : len(c)] = (
                torch.tensor(d, dtype=tokens.dtype),
                torch.tensor(c, dtype=conf.dtype),
            )
            if logprobs is not None:  # None: a greedy pass, whose p_d nothing reads
                logprobs[i, : len(d)] = float("-inf")
                logprobs[i, torch.arange(len(d)), torch.tensor(d, dtype=torch.long)] = 0.0
        return DraftOutput(tokens, logprobs, conf)


_HOOKS: weakref.WeakKeyDictionary[Any, DraftHook] = weakref.WeakKeyDictionary()


def draft_hook(engine: Any) -> DraftHook:
    """The engine's draft hook (installed on first use); set its `fn` to replace drafts."""
    spec = engine.spec
    assert spec is not None, "draft_hook needs an engine with drafting on"
    if spec not in _HOOKS:
        _HOOKS[spec] = DraftHook(spec)
    return _HOOKS[spec]
