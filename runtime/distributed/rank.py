"""One rank of an expert-parallel engine: its share of the experts, the group's platform, lockstep
stepping and EPLB.

`Engine(..., rank=RankSetup(...))` keeps every dense weight, slices each MoE's experts to this rank's
slots (DeepInfer's initial layout plus redundant copies), traces the model with expert-parallel MoEs and
lowers it onto the platform whose dispatch/combine rules exchange rows over the group. `bind` then makes
the engine's target steps and draft passes lockstep rounds (runtime/distributed/lockstep.py); every
`interval` steps (the first after interval / 4, as DeepInfer) the ranks rebalance the placement from
the last `window` steps' counts (eplb.py) and move the expert weights, between steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dsgraph.platform.registry import Platform, get_platform
from dsgraph.runtime.distributed import eplb
from dsgraph.runtime.distributed.config import EPConfig, check_ep, num_redundant
from dsgraph.runtime.distributed.exchange import ExpertExchange
from dsgraph.runtime.distributed.group import group_platform
from dsgraph.runtime.distributed.lockstep import Lockstep
from dsgraph.runtime.distributed.move import apply_move, move_plan
from dsgraph.runtime.distributed.placement import Placement, initial
from dsgraph.runtime.distributed.shared_tables import share_tables

EXPERTS = "ffn.experts."
STAT_INTERVAL = 128  # steps between load-balance measurements (an all-reduce), as DeepInfer
EXPERT_TENSORS = tuple(f"{w}.{kind}" for w in ("w1", "w3", "w2") for kind in ("weight", "scale"))


def moe_prefixes(weights: Mapping[str, Any]) -> list[str]:
    tail = EXPERTS + "w1.weight"
    return sorted(k.removesuffix(tail) for k in weights if k.endswith(tail))


def initial_placements(weights: Mapping[str, torch.Tensor], cfg: EPConfig) -> dict[str, Placement]:
    """Per MoE: routed experts + redundant ones by DeepInfer's rounding, backbone and drafter apart."""
    out = {}
    for moe in moe_prefixes(weights):
        num = int(weights[moe + "ffn.gate.weight"].shape[0])
        what = "drafter experts" if moe.startswith("mtp.") else "backbone experts"
        extra = num_redundant(num, cfg.ep, cfg.extra_experts, what)
        check_ep(cfg.ep, num, extra, what)
        out[moe] = initial(num, extra, cfg.ep)
    return out


@dataclass
class RankSetup:
    rank: int
    config: EPConfig
    group: Any = None  # the exchange's process group (None: the default one)
    control: Any = None  # the group of votes and counts (host tensors; None: the default one)
    placements: dict[str, Placement] = field(default_factory=dict)
    exchange: ExpertExchange | None = None
    lockstep: Lockstep | None = None
    imbalance: float = 1.0
    imbalance_before: float = 1.0
    rebalances: int = 0
    steps: int = 0
    moved_bytes: int = 0  # expert weight bytes this rank received in rebalances
    history: list[tuple[str, Placement, Placement]] = field(default_factory=list)  # (moe, old, new)
    shared_dir: str | None = None  # the node's folder for its one copy of the Engram tables
    first_on_node: bool = False

    def local_weights(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every dense weight (the Engram tables mapped from the node's one copy), and of each MoE's
        experts this rank's physical slots."""
        self.placements = initial_placements(weights, self.config)
        self.exchange = ExpertExchange(
            self.rank, self.config.ep, self.placements, self.group, self.config.capacity, self.control
        )
        self.stats = eplb.ExpertStats(self.config.window)
        out = dict(weights)
        for moe, p in self.placements.items():
            local = list(p.local(self.rank))
            for name in EXPERT_TENSORS:
                if moe + EXPERTS + name in weights:
                    out[moe + EXPERTS + name] = weights[moe + EXPERTS + name][local].contiguous()
        if self.shared_dir is not None:
            out = share_tables(out, self.shared_dir, self.first_on_node, self.control)
        return out

    def platform(self, name: str) -> Platform:
        assert self.exchange is not None, "local_weights first"
        return group_platform(get_platform(name), self.exchange)

    def bind(self, engine: Any) -> None:
        """Make the engine's graph runs lockstep rounds (the one place that wraps them)."""
        session, drafter = engine.session, engine.spec.drafter if engine.spec is not None else None
        run_step = session.run
        empty = {
            n: np.zeros([0 if isinstance(d, str) else d for d in t.shape], np.int32)
            for n, t in session.model.step_types().items()
        }
        dummies: dict[str, Any] = {"step": lambda: run_step(empty)}
        self._weight_dicts = [session.weights]
        if drafter is not None:
            run_draft = drafter.run
            dummies["draft"] = lambda: run_draft([])
            drafter.run = lambda reqs, **kw: self.lockstep.run("draft", lambda: run_draft(reqs, **kw))
            self._weight_dicts.append(drafter.weights)
        self.lockstep = Lockstep(self.config.ep, dummies, self._on_round, self.control)
        session.run = lambda step, fix=None: self.lockstep.run("step", lambda: run_step(step, fix))
        interval = self.config.interval
        self._next = max(1, interval // 4) if interval else 0

    def _on_round(self, kind: str) -> None:
        assert self.exchange is not None
        self.stats.record(self.exchange.take_counts())
        if kind != "step":
            return
        self.steps += 1
        if self._next and self.steps > self._next:
            self.rebalance()
            self._next += self.config.interval
        elif self.steps % STAT_INTERVAL == 0:
            self.measure()

    def _global_loads(self) -> dict[str, np.ndarray]:
        """The window's tokens per logical expert of every MoE, summed over the group (one all-reduce)."""
        names = list(self.placements)
        parts = [self.stats.loads(m, self.placements[m].num_logical).astype(np.int64) for m in names]
        flat = torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.int64)
        dist.all_reduce(flat, group=self.control)
        out, at = {}, 0
        for m, c in zip(names, parts, strict=True):
            out[m], at = flat[at : at + len(c)].numpy(), at + len(c)
        return out

    def measure(self, loads: dict[str, np.ndarray] | None = None) -> float:
        """Imbalance as DeepInfer reports it: sum over MoEs of the slowest rank's window load over the
        sum of the mean rank loads (1.0: balanced)."""
        loads = self._global_loads() if loads is None else loads
        ranks = [self.placements[m].rank_loads(c) for m, c in loads.items()]
        mx, mean = sum(float(r.max()) for r in ranks), sum(float(r.mean()) for r in ranks)
        self.imbalance = mx / mean if mean > 0 else 1.0
        return self.imbalance

    def rebalance(self) -> None:
        """New placements from the window's counts summed over the group; the experts move between
        steps (all ranks call this at the same round)."""
        assert self.exchange is not None
        loads = self._global_loads()
        self.imbalance_before = self.measure(loads)
        for moe, p in self.placements.items():
            new = eplb.rebalance(p, loads[moe])
            if new != p:
                self._move(moe, p, new)
                self.history.append((moe, p, new))
                self.placements[moe] = new
                self.exchange.set_placement(moe, new)
        self.measure(loads)
        self.rebalances += 1

    def _move(self, moe: str, old: Placement, new: Placement) -> None:
        """Bring this rank's expert slots to `new`, in place: only slots whose expert this rank did not
        hold travel (move.py); `moved_bytes` counts what this rank received."""
        plan = move_plan(old, new)
        for name in EXPERT_TENSORS:
            key = f"weights.{moe}{EXPERTS}{name}"
            held = [d for d in self._weight_dicts if key in d]
            if not held:
                continue
            local = held[0][key]
            moved = apply_move(plan, self.rank, local, self.group)
            self.moved_bytes += plan.received(self.rank) * (local[0].numel() * local.element_size())
            for d in held:
                d[key].copy_(moved)

    def load_stats(self) -> dict[str, float]:
        """For /metrics and the bench: the last measured imbalance (and the one before the last
        rebalance), rebalances done, dummy graph runs of this rank."""
        return {
            "imbalance": self.imbalance,
            "imbalance_before_rebalance": self.imbalance_before,
            "rebalances": float(self.rebalances),
            "dummy_runs": float(self.lockstep.dummy_runs if self.lockstep else 0),
            "moved_bytes": float(self.moved_bytes),
            "capacity_overflows": float(self.exchange.overflows if self.exchange else 0),
            "capacity_padded": float(self.exchange.padded if self.exchange else 0),
        }
