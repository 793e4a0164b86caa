"""The collective rules of `moe_dispatch` / `moe_combine` (ops/moe.py) on an expert-parallel group.

dispatch: each (token, slot) pair of this rank goes to the rank holding a replica of its expert (copy
`token % copies` of the expert, so a hot expert's tokens spread over its replicas); pairs are sent in
(destination, token, slot) order, one all-to-all of their bytes (row, local slot, weight). combine: the
experts' output of every received row goes back to its source (the reverse all-to-all) and each token
adds its pairs from zero in increasing expert id order, which is exactly how the one-rank `moe_experts`
sums (platform/cpu/rules_moe.py): the group's output equals one process's bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dsgraph.runtime.distributed import padded
from dsgraph.runtime.distributed.placement import Placement

Tensor = torch.Tensor
_NO_SLOT = torch.tensor([[-1]], dtype=torch.int32)
_ZERO_W = torch.zeros((1, 1), dtype=torch.float32)


def _exchange(send: Tensor, counts: list[int], group: Any) -> tuple[Tensor, list[int]]:
    """all-to-all of rows (`counts[r]` rows to rank r); returns the received rows and their counts."""
    ep = len(counts)
    # the counts travel where the rows are (NCCL moves device tensors only)
    sent = torch.tensor(counts, dtype=torch.int64, device=send.device)
    got = torch.empty(ep, dtype=torch.int64, device=send.device)
    dist.all_to_all_single(got, sent, group=group)
    recv_counts = [int(c) for c in got]
    width = send.shape[1]
    out = torch.empty((sum(recv_counts), width), dtype=send.dtype, device=send.device)
    dist.all_to_all_single(
        out.view(-1),
        send.contiguous().view(-1),
        [c * width for c in recv_counts],
        [c * width for c in counts],
        group=group,
    )
    return out, recv_counts


def _bytes(t: Tensor) -> Tensor:
    """Rows of `t` [P, ...] as raw bytes [P, B] (gloo moves any dtype this way, bits unchanged)."""
    width = math.prod(t.shape[1:]) * t.element_size()
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], width)


class ExpertExchange:
    """One rank's view of the group: placements per MoE, the pending combines, this step's counts."""

    def __init__(
        self,
        rank: int,
        ep: int,
        placements: Mapping[str, Placement],
        group: Any = None,
        capacity: int = 0,
        control: Any = None,
    ) -> None:
        # capacity > 0: rows per rank pair, static shapes (padded.py); 0: exactly the routed rows
        self.rank, self.ep, self.group, self.capacity, self.control = rank, ep, group, capacity, control
        self.overflows = 0  # layers that exceeded the capacity and took the dynamic exchange
        self.padded = 0  # layers that took the fixed-capacity exchange
        self.placements: dict[str, Placement] = {}
        self.tables: dict[str, tuple[Tensor, Tensor]] = {}
        self.counts: dict[str, np.ndarray] = {}  # moe -> tokens per logical expert since the last take
        self._pending: dict[str, tuple[Tensor, Any]] = {}  # moe -> (pair order, counts or buffer rows)
        for moe, p in placements.items():
            self.set_placement(moe, p)

    def set_placement(self, moe: str, p: Placement) -> None:
        if p.ep != self.ep:
            raise ValueError(f"placement of {moe} is for {p.ep} ranks, the group has {self.ep}")
        table, counts = p.table()
        self.placements[moe] = p
        self.tables[moe] = (torch.from_numpy(table), torch.from_numpy(counts))
        self.counts.setdefault(moe, np.zeros(p.num_logical, np.int64))

    def take_counts(self) -> dict[str, np.ndarray]:
        out = self.counts
        self.counts = {m: np.zeros_like(c) for m, c in out.items()}
        return out

    def dispatch(self, p: Any, x: Tensor, ids: Tensor, weights: Tensor) -> tuple[Tensor, ...]:
        table, copies = (a.to(ids.device) for a in self.tables[p.moe])
        t, k = ids.shape
        flat = ids.reshape(-1).long()
        tokens = torch.arange(t, device=ids.device).repeat_interleave(k)
        phys = table[flat, tokens % copies[flat]]
        slots = self.placements[p.moe].slots_per_rank
        dest = phys // slots
        order = torch.sort(dest, stable=True).indices  # (destination, token, slot) order
        counts = torch.bincount(dest, minlength=self.ep).tolist()
        self.counts[p.moe] += np.bincount(flat.cpu().numpy(), minlength=len(self.counts[p.moe]))
        local = (phys % slots).to(torch.int32)[order]
        payload = torch.cat(
            [_bytes(x[tokens[order]]), _bytes(local[:, None]), _bytes(weights.reshape(-1)[order][:, None])], 1
        )
        if self.capacity and padded.fits(counts, self.capacity, self.control):
            pos = padded.positions(dest[order], counts, self.capacity)
            # padding: zero activations, local slot -1 (no expert), weight 0
            pad = torch.cat([_bytes(x[:1].new_zeros(1, x.shape[1])), _bytes(_NO_SLOT), _bytes(_ZERO_W)], 1)
            got = padded.exchange(
                payload, pos.to(payload.device), self.ep, self.capacity, pad.to(x.device), self.group
            )
            self._pending[p.moe] = (order, pos)
            self.padded += 1
            return self._received(got, [self.capacity] * self.ep, x, k)
        self.overflows += bool(self.capacity)
        got, recv_counts = _exchange(payload, counts, self.group)
        self._pending[p.moe] = (order, counts)
        return self._received(got, recv_counts, x, k)

    def _received(self, got: Tensor, recv_counts: list[int], x: Tensor, k: int) -> tuple[Tensor, ...]:
        rows, hb = got.shape[0], x.shape[1] * x.element_size()
        xr = got[:, :hb].contiguous().view(x.dtype).reshape(rows, x.shape[1])
        dev = got.device
        ids = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
        ids[:, 0] = got[:, hb : hb + 4].contiguous().view(torch.int32).reshape(rows)
        w = torch.zeros((rows, k), dtype=torch.float32, device=dev)
        w[:, 0] = got[:, hb + 4 : hb + 8].contiguous().view(torch.float32).reshape(rows)
        src = torch.arange(self.ep, dtype=torch.int32, device=dev).repeat_interleave(
            torch.tensor(recv_counts, device=dev)
        )
        return xr, ids, w, src

    def combine(self, p: Any, y: Tensor, src: Tensor, ids: Tensor) -> Tensor:
        order, counts = self._pending.pop(p.moe)
        if isinstance(counts, Tensor):  # the padded exchange: `counts` are the pairs' buffer rows
            got = padded.back(y.float(), self.group)[counts]
        else:
            back_counts = torch.bincount(src.long(), minlength=self.ep).tolist()
            got, _ = _exchange(_bytes(y.float()), back_counts, self.group)
            got = got.contiguous().view(torch.float32).reshape(-1, y.shape[1])
        t, k = ids.shape
        pairs = torch.empty((t * k, y.shape[1]), dtype=torch.float32, device=y.device)
        pairs[order] = got
        pairs = pairs.reshape(t, k, y.shape[1])
        by_id = torch.sort(ids, dim=1, stable=True).indices
        out = torch.zeros((t, y.shape[1]), dtype=torch.float32, device=y.device)
        rows = torch.arange(t, device=y.device)
        for j in range(k):  # one rank's moe_experts adds a token's experts in increasing id order
            out += pairs[rows, by_id[:, j]]
        return out
