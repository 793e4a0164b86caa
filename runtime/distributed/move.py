"""The weight move of an EPLB rebalance: only the slots whose expert a rank does not hold yet travel.

Every rank derives the same plan from the old and the new placement. A new slot of rank r whose expert
is already in one of r's old slots is a local copy; any other takes the expert from a rank that held it
(its replicas taken in turn, so a copied expert's senders share the work), in one sized all-to-all
whose rows go in (destination slot) order. So the bytes on the wire are the changed slots' rows and
nothing else; a rebalance that changes no rank's set of experts sends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dsgraph.runtime.distributed.placement import Placement


@dataclass(frozen=True)
class MovePlan:
    ep: int
    local: dict[int, list[tuple[int, int]]]  # rank -> (new local slot, old local slot) copies
    # (source rank, destination rank) -> [(source's old local slot, destination's new local slot)]
    sends: dict[tuple[int, int], list[tuple[int, int]]]

    def received(self, rank: int) -> int:
        """Rows `rank` receives from other ranks."""
        return sum(len(v) for (s, d), v in self.sends.items() if d == rank)


def move_plan(old: Placement, new: Placement) -> MovePlan:
    if (old.ep, len(old.phys_to_logical)) != (new.ep, len(new.phys_to_logical)):
        raise ValueError(
            f"placements of {old.ep} and {new.ep} ranks, {old.slots_per_rank} and "
            f"{new.slots_per_rank} slots each: a rebalance keeps both"
        )
    s = old.slots_per_rank
    holders: dict[int, list[int]] = {}
    for slot, e in enumerate(old.phys_to_logical):
        holders.setdefault(e, []).append(slot)
    turn = {e: 0 for e in holders}
    local: dict[int, list[tuple[int, int]]] = {r: [] for r in range(old.ep)}
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r in range(old.ep):
        mine = old.local(r)
        for j, e in enumerate(new.local(r)):
            if e in mine:
                local[r].append((j, mine.index(e)))
                continue
            slot = holders[e][turn[e] % len(holders[e])]
            turn[e] += 1
            sends.setdefault((slot // s, r), []).append((slot % s, j))
    return MovePlan(old.ep, local, sends)


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64, device=device)


def apply_move(plan: MovePlan, rank: int, rows: torch.Tensor, group: object = None) -> torch.Tensor:
    """This rank's new slot rows from its old ones `rows` [slots, ...] (any dtype; moved as bytes)."""
    flat = rows.contiguous().view(torch.uint8).reshape(rows.shape[0], -1)
    out = torch.empty_like(flat)
    for j, i in plan.local[rank]:
        out[j] = flat[i]
    if plan.sends:  # every rank sees the same plan: all of them skip the collective together
        order = range(plan.ep)
        out_rows = [[i for i, _ in plan.sends.get((rank, d), [])] for d in order]
        into = [[j for _, j in plan.sends.get((src, rank), [])] for src in order]
        send = flat[_index([i for rows_to in out_rows for i in rows_to], flat.device)]
        width = flat.shape[1]
        got = torch.empty((sum(len(x) for x in into), width), dtype=torch.uint8, device=flat.device)
        dist.all_to_all_single(
            got.view(-1),
            send.reshape(-1),
            [len(x) * width for x in into],
            [len(x) * width for x in out_rows],
            group=group,
        )
        out[_index([j for js in into for j in js], flat.device)] = got
    return out.view(rows.dtype).reshape(rows.shape)
