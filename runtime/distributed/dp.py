"""Data-parallel attention over an expert-parallel group, driven from one process: `EPRunner` starts
the ranks (launch.RankGroup), hands each its share of the requests (request i to rank i mod ep; each
rank holds its own requests, caches and scheduler), runs them in lockstep and returns the outputs in
request order."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsgraph.runtime.distributed.config import EPConfig
from dsgraph.runtime.distributed.group import Rendezvous
from dsgraph.runtime.distributed.launch import RankGroup


def rank_start(state: dict[str, Any], model: str, config: dict[str, Any], ep_config: EPConfig) -> None:
    from dsgraph.runtime.distributed.rank import RankSetup
    from dsgraph.runtime.engine import Engine, EngineConfig
    from dsgraph.runtime.llm import LLM

    setup = RankSetup(state["rank"], ep_config, control=state.get("control"))
    setup.shared_dir, setup.first_on_node = state.get("shared_dir"), state.get("first_on_node", False)
    state["setup"] = setup
    state["llm"] = LLM.from_engine(Engine(model, EngineConfig.from_flat(**config), rank=setup))


def rank_generate(state: dict[str, Any], prompts: list[Any], params: list[Any]) -> list[Any]:
    """This rank's requests to completion, then dummy rounds until every rank is done."""
    outs = state["llm"].generate(prompts, params) if prompts else []
    while state["setup"].lockstep.idle():
        pass
    return outs


def rank_call(state: dict[str, Any], fn: Any, *args: Any) -> Any:
    """fn(setup, engine, *args) on a rank (tests, the bench and /metrics read their state this way)."""
    return fn(state["setup"], state["llm"].engine, *args)


class EPRunner:
    def __init__(
        self,
        model: str | Path,
        ep_config: EPConfig,
        config: dict[str, Any],
        rv: Rendezvous | None = None,
    ) -> None:
        self.ep = ep_config.ep
        platform = str(config.get("platform", "cpu"))
        self.group = RankGroup(self.ep, rv, platform=platform, timeout_s=ep_config.timeout_s)
        try:
            self.group.call(rank_start, [(str(model), config, ep_config)] * len(self.group.ranks))
        except BaseException:
            self.group.close(force=True)
            raise

    def generate(self, prompts: Sequence[Any], params: Any) -> list[Any]:
        items = list(prompts)
        plist = list(params) if isinstance(params, Sequence) else [params] * len(items)
        mine = [list(range(r, len(items), self.ep)) for r in range(self.ep)]
        args = [([items[i] for i in m], [plist[i] for i in m]) for m in mine]
        outs: dict[int, Any] = {}
        for m, got in zip(mine, self.group.call(rank_generate, args), strict=True):
            for i, out in zip(m, got, strict=True):
                outs[i] = dataclasses.replace(out, request_id=str(i))
        return [outs[i] for i in range(len(items))]

    def call(self, fn: Any, *args: Any) -> list[Any]:
        return self.group.call(rank_call, [(fn, *args)] * len(self.group.ranks))

    def close(self) -> None:
        self.group.close()
