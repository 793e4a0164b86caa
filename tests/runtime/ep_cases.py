"""Calls the expert-parallel tests run on each rank (importable by the spawned rank processes)."""

from __future__ import annotations

from typing import Any

import torch

from dsgraph.ops.moe import MoeCombineParams, MoeDispatchParams, MoeExpertsParams
from dsgraph.platform.cpu import rules_moe
from dsgraph.runtime.distributed.exchange import ExpertExchange
from dsgraph.runtime.distributed.placement import Placement

MOE = "layers.0."


def experts_params(gemm_out_dtype: str = "bf16") -> MoeExpertsParams:
    return MoeExpertsParams(swiglu_limit=7.0, out_dtype="f32", gemm_out_dtype=gemm_out_dtype)


def moe_case(
    state: dict[str, Any],
    x: torch.Tensor,
    ids: torch.Tensor,
    w: torch.Tensor,
    placement: Placement,
    experts: tuple[torch.Tensor, ...],
    gemm_out_dtype: str,
    capacity: int = 0,
) -> tuple[torch.Tensor, int, int]:
    """This rank's tokens through dispatch -> its local experts -> combine; also the rows the experts
    got and whether the layer overflowed the capacity."""
    ex = ExpertExchange(state["rank"], state["ep"], {MOE: placement}, capacity=capacity)
    s = placement.slots_per_rank
    local = slice(state["rank"] * s, (state["rank"] + 1) * s)  # `experts` are per physical slot
    xe, ie, we, src = ex.dispatch(MoeDispatchParams(MOE, ("rows",)), x, ids, w)
    y = rules_moe.moe_experts(experts_params(gemm_out_dtype), xe, ie, we, *(t[local] for t in experts))
    return ex.combine(MoeCombineParams(MOE), y, src, ids), int(xe.shape[0]), ex.overflows


def identity_case(state: dict[str, Any], x: torch.Tensor, ids: torch.Tensor, placement: Placement) -> tuple:
    """dispatch, then combine of the received rows themselves (k = 1: the identity); also what arrived."""
    ex = ExpertExchange(state["rank"], state["ep"], {MOE: placement})
    w = torch.ones(ids.shape, dtype=torch.float32)
    xe, ie, _, src = ex.dispatch(MoeDispatchParams(MOE, ("rows",)), x, ids, w)
    return ex.combine(MoeCombineParams(MOE), xe.float(), src, ids), int(xe.shape[0]), ie[:, 0].tolist()


def load_stats(setup: Any, _engine: Any) -> dict[str, float]:
    return setup.load_stats()


def layout(setup: Any, engine: Any) -> dict[str, tuple[int, ...]]:
    """Per MoE: the leading dim of this rank's expert weights and the placement's slots."""
    w = {**engine.session.weights, **(engine.spec.drafter.weights if engine.spec else {})}
    return {
        m: (int(w[f"weights.{m}ffn.experts.w1.weight"].shape[0]), len(p.phys_to_logical))
        for m, p in setup.placements.items()
    }


def moved(setup: Any, _engine: Any) -> bool:
    """Whether some MoE's placement differs from the initial layout (a rebalance moved experts)."""
    from dsgraph.runtime.distributed.placement import initial

    return any(
        p != initial(p.num_logical, len(p.phys_to_logical) - p.num_logical, p.ep)
        for p in setup.placements.values()
    )


def die_after(setup: Any, engine: Any, rank: int, runs: int) -> None:
    """Make `rank` kill itself (SIGKILL: no cleanup, as a crash) at its `runs`-th graph run."""
    import os
    import signal

    if setup.rank != rank:
        return
    run, count = engine.session.run, [0]

    def dying(*args: Any, **kw: Any) -> Any:
        count[0] += 1
        if count[0] >= runs:
            os.kill(os.getpid(), signal.SIGKILL)
        return run(*args, **kw)

    engine.session.run = dying


def move_case(state: dict[str, Any], old: Placement, new: Placement, physical: torch.Tensor) -> tuple:
    """This rank's rows of `physical` [logical experts, ...] under `old`, moved to `new`: (the new rows,
    the bytes this rank received)."""
    from dsgraph.runtime.distributed.move import apply_move, move_plan

    plan = move_plan(old, new)
    mine = physical[list(old.local(state["rank"]))]
    row = mine[0].numel() * mine.element_size()
    return apply_move(plan, state["rank"], mine), plan.received(state["rank"]) * row


def rebalance_history(setup: Any, engine: Any) -> tuple[list[tuple[Any, ...]], dict[str, int], float]:
    """(moe, old, new) of every rebalance that moved experts, each MoE's bytes per expert slot (all
    expert tensors), and the bytes this rank says it received."""
    w = {**engine.session.weights, **(engine.spec.drafter.weights if engine.spec else {})}
    per_slot = {}
    for m in setup.placements:
        names = [
            f"weights.{m}ffn.experts.{n}" for n in ("w1", "w3", "w2") for n in (n + ".weight", n + ".scale")
        ]
        per_slot[m] = sum(w[n][0].numel() * w[n].element_size() for n in names if n in w)
    return list(setup.history), per_slot, setup.moved_bytes


def engram_pages(setup: Any, engine: Any, touch: bool) -> dict[str, tuple[Any, ...]]:
    """Per Engram table of this rank's session: the (device, inode) of the file mapping its storage lies
    in, and that mapping's Rss and shared kB from /proc/self/smaps (after reading every byte if `touch`)."""
    from dsgraph.platform.cuda.placement import is_host_table

    out = {}
    for name, t in engine.session.weights.items():
        if not is_host_table(name) or t.numel() == 0:
            continue
        if touch:
            t.view(torch.uint8).sum()
        out[name] = _mapping_of(t.data_ptr())
    return out


def _mapping_of(addr: int) -> tuple[Any, ...]:
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        head = line.split()
        if "-" not in head[0] or len(head) < 5:
            continue
        lo, hi = (int(a, 16) for a in head[0].split("-"))
        if lo <= addr < hi:
            fields = {}
            for row in lines[i + 1 :]:
                key = row.split(":")[0]
                if "-" in row.split()[0]:
                    break
                fields[key] = int(row.split()[1]) if row.split()[1].isdigit() else 0
            shared = fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0)
            return head[3], int(head[4]), " ".join(head[5:]), fields.get("Rss", 0), shared
    return ("anonymous", 0, "", 0, 0)
