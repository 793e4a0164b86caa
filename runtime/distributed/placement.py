"""Where each MoE's experts live: physical slots split evenly across ranks, each slot a replica of one
logical expert. The initial layout is DeepInfer's: [every routed expert, then copies of 0, 1, ...]."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Placement:
    num_logical: int
    ep: int
    phys_to_logical: tuple[int, ...]  # global physical slot -> logical expert

    def __post_init__(self) -> None:
        n = len(self.phys_to_logical)
        if n % self.ep:
            raise ValueError(f"placement: {n} physical slots do not divide over {self.ep} ranks")
        if set(self.phys_to_logical) != set(range(self.num_logical)):
            raise ValueError(f"placement: every one of the {self.num_logical} experts needs a replica")

    @property
    def slots_per_rank(self) -> int:
        return len(self.phys_to_logical) // self.ep

    def local(self, rank: int) -> tuple[int, ...]:
        """The logical experts of `rank`'s slots, in slot order."""
        s = self.slots_per_rank
        return self.phys_to_logical[rank * s : (rank + 1) * s]

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(replicas [E, max copies] of physical slots, -1 padded; counts [E])."""
        counts = np.bincount(np.asarray(self.phys_to_logical), minlength=self.num_logical)
        table = np.full((self.num_logical, int(counts.max())), -1, np.int64)
        fill = np.zeros(self.num_logical, np.int64)
        for slot, e in enumerate(self.phys_to_logical):
            table[e, fill[e]] = slot
            fill[e] += 1
        return table, counts

    def rank_loads(self, loads: np.ndarray) -> np.ndarray:
        """Tokens per rank when each expert's `loads` split evenly over its replicas."""
        _, counts = self.table()
        per = np.asarray(loads, np.float64)[list(self.phys_to_logical)] / counts[list(self.phys_to_logical)]
        return per.reshape(self.ep, self.slots_per_rank).sum(axis=1)


def initial(num_logical: int, extra: int, ep: int) -> Placement:
    return Placement(
        num_logical, ep, tuple(range(num_logical)) + tuple(i % num_logical for i in range(extra))
    )
