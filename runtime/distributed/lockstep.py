"""Lockstep: every rank runs the same sequence of graphs, since each MoE of a graph is a collective.

Before a graph runs, the ranks vote (one all-gather) on the kind each wants to run next: a draft pass,
a target step, or nothing (idle). The highest wins (draft > step > idle: a draft only follows its own
rank's step, so preferring it starves nobody); a rank that wanted something else runs a dummy of the
winning kind (a zero-row step or draft pass: every collective, no request touched) and votes again.
When every rank votes idle, the round says so and the ranks' drivers stop. Between rounds `on_round`
runs with the winning kind on every rank at once (EPLB's bookkeeping and weight shuffle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
KINDS = ("idle", "step", "draft")


class Lockstep:
    def __init__(
        self,
        ep: int,
        dummies: dict[str, Callable[[], Any]],
        on_round: Callable[[str], None] | None = None,
        group: Any = None,
    ) -> None:
        self.ep, self.dummies, self.on_round, self.group = ep, dummies, on_round, group
        self.rounds = 0
        self.dummy_runs = 0

    def _vote(self, kind: str) -> str:
        mine = torch.tensor([KINDS.index(kind)], dtype=torch.int64)
        votes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.ep)]
        dist.all_gather(votes, mine, group=self.group)
        chosen = KINDS[int(max(int(v) for v in votes))]
        if chosen != "idle":
            self.rounds += 1
            if self.on_round is not None:
                self.on_round(chosen)
        return chosen

    def run(self, kind: str, fn: Callable[[], T]) -> T:
        """Run this rank's graph of `kind` once every rank is ready for that kind."""
        while (chosen := self._vote(kind)) != kind:
            self._dummy(chosen)
        return fn()

    def idle(self) -> bool:
        """One round with nothing to run here: False when every rank was idle (all done)."""
        chosen = self._vote("idle")
        if chosen == "idle":
            return False
        self._dummy(chosen)
        return True

    def _dummy(self, kind: str) -> None:
        self.dummy_runs += 1
        self.dummies[kind]()
