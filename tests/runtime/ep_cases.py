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
) -> torch.Tensor:
    """This rank's tokens through dispatch -> its local experts -> combine."""
    ex = ExpertExchange(state["rank"], state["ep"], {MOE: placement})
    s = placement.slots_per_rank
    local = slice(state["rank"] * s, (state["rank"] + 1) * s)  # `experts` are per physical slot
    xe, ie, we, src = ex.dispatch(MoeDispatchParams(MOE, ("rows",)), x, ids, w)
    y = rules_moe.moe_experts(experts_params(gemm_out_dtype), xe, ie, we, *(t[local] for t in experts))
    return ex.combine(MoeCombineParams(MOE), y, src, ids)


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
