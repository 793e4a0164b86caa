"""`GroupEngine`: the Engine interface the server uses (runtime/server/engine_loop.py), over the ranks of
an expert-parallel group. Each request goes to the rank with the fewest requests (data-parallel
attention), on any node: node 0's process reaches the other nodes' ranks through their relays
(nodes.py); the ranks serve in lockstep (serve_loop.py) and stream their token events back. A rank that
dies raises RankError (naming it and the cause) from the next call, within `poll_s` plus the group's
timeout: the server's engine loop then stops and answers 503."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsgraph.runtime.distributed.config import EPConfig
from dsgraph.runtime.distributed.dp import EPRunner
from dsgraph.runtime.distributed.group import Rendezvous
from dsgraph.runtime.distributed.launch import RankError
from dsgraph.runtime.distributed.nodes import NodeLinks
from dsgraph.runtime.distributed.serve_loop import rank_serve
from dsgraph.runtime.sampling_params import RequestError, SamplingParams

POLL_S = 0.05


@dataclass(frozen=True)
class _Pages:
    total: int
    used: int
    idle: int


class _Native:
    def __init__(self, front: GroupEngine) -> None:
        self.front = front

    @property
    def config(self) -> Any:
        return type("C", (), {"num_slots": sum(u["num_slots"] for u in self.front.usage.values())})

    @property
    def num_free_slots(self) -> int:
        return sum(u["free_slots"] for u in self.front.usage.values())


class _Scheduler:
    """The group's cache occupancy, summed over the ranks' last reports."""

    def __init__(self, front: GroupEngine) -> None:
        self.front, self.native = front, _Native(front)

    def page_usage(self, ratio: int) -> _Pages:
        rows = [u["pages"][ratio] for u in self.front.usage.values()]
        return _Pages(*(sum(col) for col in zip(*rows, strict=True)))


class GroupEngine:
    def __init__(
        self, model_dir: str | Path, config: Any, ep: EPConfig, rv: Rendezvous | None = None
    ) -> None:
        from dsgraph.models.interface import default_geometry, numerics_for
        from dsgraph.models.registry import family_for

        root = Path(model_dir)
        family = family_for(root)
        self.cfg, self.config = family.load_config(root), config
        self.tokenizer = family.load_tokenizer(root, self.cfg)
        geo = default_geometry(
            self.cfg.text,
            min(config.max_model_len, self.cfg.text.max_position_embeddings),
            config.cache.page_size,
        )
        self.model = family.build(self.cfg, self.tokenizer, numerics_for(config.numerics), geo, False)
        # node 0 listens before the ranks start, so another node's relay never finds the port closed
        self.links = None
        if rv is not None and rv.nnodes > 1 and rv.node_rank == 0:
            self.links = NodeLinks(rv, ep.ep, None)
        try:
            self.runner = EPRunner(root, ep, config.flat(), rv)
        except BaseException:
            if self.links is not None:
                self.links.listener.close()
            raise
        self.group = self.runner.group
        self.ranks = list(range(ep.ep)) if self.links is not None else list(self.group.ranks)
        self.owner: dict[int, int] = {}  # request -> rank
        self.usage: dict[int, dict[str, Any]] = {}
        self._events: list[Any] = []
        self._acks: dict[int, Any] = {}
        self.scheduler = _Scheduler(self)
        self.dead: RankError | None = None
        self.group.start(rank_serve)
        if self.links is not None:
            self.links.outbox = self.group.outbox
            try:
                self.links.accept(ep.timeout_s)
            except RankError:
                self.group.close(force=True)
                raise
        while len(self.usage) < len(self.ranks):
            self._pump(POLL_S)

    @property
    def has_unfinished(self) -> bool:
        # a dead group has "work": the server's loop steps, gets the error and stops (/health: 503)
        return bool(self.owner) or bool(self._events) or self.dead is not None

    def _pump(self, timeout: float) -> None:
        """Take the ranks' messages for up to `timeout` s (liveness checked on every wait)."""
        if self.dead is not None:
            raise self.dead
        try:
            msg = self.group.outbox.get(timeout=timeout)
        except queue.Empty:
            try:
                self.group.check()
            except RankError as exc:
                self.dead = exc
                raise
            return
        kind, rank = msg[0], msg[1]
        if kind == "dead":  # another node's rank, as its relay saw it
            self.dead = RankError(rank, msg[2])
            self.group.close(force=True)
            raise self.dead
        if kind == "ack":
            self._acks[msg[2]] = msg[3]
        elif kind == "usage":
            self.usage[rank] = msg[2]
        else:
            self._events.extend(msg[2])
            self.usage[rank] = msg[3]

    def add_request(
        self,
        rid: int,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int | None = None,
        max_chunk: int = 0,
    ) -> None:
        load = {r: 0 for r in self.ranks}
        for r in self.owner.values():
            load[r] += 1
        rank = min(load, key=lambda r: (load[r], r))
        from dsgraph.runtime.server.engine_loop import EngineDead

        if self.dead is not None:
            raise EngineDead(f"the expert-parallel group ended: {self.dead}")
        try:
            self._to(rank, ("add", rid, list(prompt_ids), params, seed, max_chunk))
            while rid not in self._acks:
                self._pump(POLL_S)
        except RankError as exc:
            raise EngineDead(f"the expert-parallel group ended: {exc}") from exc
        err = self._acks.pop(rid)
        if err is not None:
            name, why = err
            raise RequestError(*why) if name == "RequestError" and len(why) == 3 else ValueError(why[0])
        self.owner[rid] = rank

    def step(self) -> list[Any]:
        while not self._events:
            self._pump(POLL_S)
        events, self._events = self._events, []
        for e in events:
            if e.finished:
                self.owner.pop(e.rid, None)
        return events

    def _to(self, rank: int, cmd: tuple) -> None:
        if rank in self.group.ranks:
            self.group.inboxes[rank - self.group.ranks[0]].put(cmd)
        else:
            assert self.links is not None
            try:
                self.links.send(rank, cmd)
            except OSError as exc:
                self.dead = RankError(rank, f"its node's channel failed ({exc})")
                self.group.close(force=True)
                raise self.dead from None

    def _send(self, rid: int, *cmd: Any) -> None:
        rank = self.owner.get(rid)
        if rank is not None:
            self._to(rank, (cmd[0], rid, *cmd[1:]))

    def abort(self, rid: int) -> None:
        self._send(rid, "abort")
        self.owner.pop(rid, None)

    def release(self, rid: int) -> None:
        self._send(rid, "release")

    def forward_fault(self, rid: int, after_tokens: int) -> None:
        """The server's fault-injection test hook (runtime/server/fault_hook.py), for the owning rank."""
        self._send(rid, "fault", after_tokens)

    def prefix_cache_stats(self) -> tuple[int, int]:
        rows = [u["prefix"] for u in self.usage.values()]
        return sum(r[0] for r in rows), sum(r[1] for r in rows)

    def eplb_stats(self) -> dict[str, float]:
        """The group's EPLB figures for /metrics: the largest imbalance any rank measured."""
        stats = [u["eplb"] for u in self.usage.values()]
        return {k: max(s[k] for s in stats) for k in stats[0]} if stats else {}

    def close(self) -> None:
        if self.links is not None:
            self.links.close()
        for inbox in self.group.inboxes:
            inbox.put(None)
        self.group.close(force=True)
