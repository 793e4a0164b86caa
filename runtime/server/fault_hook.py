"""Test support for the server's FAULT_FIELD hook (runtime/server/hooks.py): a request fails inside the
engine (a RuntimeError in its per-request commit) once it has generated a given number of tokens, to test
that one failing request stays isolated. Imported only when a request carries the field, which the
server reads only with `create_app(..., allow_fault_injection=True)`; the engine itself holds no hook:
the first fault wraps the engine instance's per-request commit (`Engine.emit_token`)."""

from __future__ import annotations

import weakref
from typing import Any

_PLANS: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


def inject_fault(engine: Any, rid: int, after_tokens: int) -> None:
    """Make request `rid` of `engine` fail once it has `after_tokens` tokens. An expert-parallel front
    (runtime/distributed/front.py) forwards it to the rank serving the request, which calls this."""
    forward = getattr(engine, "forward_fault", None)
    if forward is not None:
        forward(rid, after_tokens)
        return
    if engine not in _PLANS:
        _PLANS[engine] = _install(engine)
    _PLANS[engine][rid] = after_tokens


def _install(engine: Any) -> dict[int, int]:
    faults: dict[int, int] = {}
    commit = engine.emit_token

    def failing_commit(i, rid, s, event):  # type: ignore[no-untyped-def]
        if rid in faults and len(engine.live[rid].tokens) >= faults[rid]:
            del faults[rid]
            raise RuntimeError(f"fault injected into request {rid} (FAULT_FIELD)")
        return commit(i, rid, s, event)

    engine.emit_token = failing_commit
    return faults
