"""The native runtime's replay table for a platform's bucketed runner: captured buckets are launched from
C++ (runtime/csrc/graph_replay.h), one crossing per step. The runtime creates it and hands it to
`make_runner`, so that platform/ never imports runtime/. DSGRAPH_NATIVE_REPLAY=0 replays from Python."""

from __future__ import annotations

from typing import Any

from dsgraph.platform import env


def replay_table() -> Any:
    """A fresh table, or None when native replay is off."""
    if not env.native_replay():
        return None
    from dsgraph.runtime import _native

    return _native.ReplayTable()
