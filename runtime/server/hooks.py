"""Test hooks, off by default (the fields are then ignored). With `create_app(..., allow_forced_outputs=True)`
a request body may carry FORCED_FIELD, token ids the engine emits instead of sampling
(SamplingParams.golden_token_ids), so tests can drive reasoning and tool-call markup through the recipe's
parser. With `allow_fault_injection=True`, FAULT_FIELD (a token count) makes the engine fail that request
once it has generated that many tokens (runtime/server/fault_hook.py), to test that a failure stays
isolated."""

from __future__ import annotations

from typing import Any

from dsgraph.runtime.server.errors import ApiError

FORCED_FIELD = "dsgraph_golden_token_ids"
FAULT_FIELD = "dsgraph_fail_after_tokens"


def _field(values: Any, field: str) -> object:
    return values.get(field) if isinstance(values, dict) else None


def forced_ids(values: Any) -> tuple[int, ...]:
    """The test hook's token ids (FORCED_FIELD) of a parsed body; () when absent."""
    ids = _field(values, FORCED_FIELD)
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError(400, f"{FORCED_FIELD}: {ids!r}, expected a list of token ids", FORCED_FIELD)
    return tuple(ids)


def fault_after(values: Any) -> int | None:
    after = _field(values, FAULT_FIELD)
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise ApiError(400, f"{FAULT_FIELD}: {after!r}, expected an integer >= 0", FAULT_FIELD)
    return after
