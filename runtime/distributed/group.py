"""The process group of an expert-parallel run: rendezvous options (or torchrun's environment), checked
before anything starts, and the cpu platform with the group's collective MoE rules."""

from __future__ import annotations

import dataclasses
import datetime
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import torch.distributed as dist

from dsgraph.platform import env as dsgraph_env
from dsgraph.platform.registry import Platform
from dsgraph.runtime.distributed.exchange import ExpertExchange

RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class Rendezvous:
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: a free port of this machine (one node only)
    nnodes: int = 1
    node_rank: int = 0

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"--nnodes is {self.nnodes}, expected >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"--node-rank is {self.node_rank}, expected 0..{self.nnodes - 1} (--nnodes {self.nnodes})"
            )
        if not 0 <= self.master_port < 65536 or (self.master_port == 0 and self.nnodes > 1):
            allowed = "1..65535" if self.nnodes > 1 else "0 (a free port) or 1..65535"
            raise ValueError(
                f"--master-port is {self.master_port}, expected {allowed} (--nnodes {self.nnodes})"
            )
        if not self.master_addr:
            raise ValueError("--master-addr is empty, expected a host name or address of node 0")

    def resolved(self) -> Rendezvous:
        """With port 0, a free port of this machine (the rendezvous of a one-node group)."""
        if self.master_port:
            return self
        with socket.socket() as s:
            s.bind((self.master_addr, 0))
            return dataclasses.replace(self, master_port=int(s.getsockname()[1]))

    def ranks_here(self, ep: int) -> range:
        """The global ranks this node runs: ep / nnodes consecutive ranks."""
        if ep % self.nnodes:
            raise ValueError(
                f"--ep {ep} does not split over --nnodes {self.nnodes}; allowed: multiples of {self.nnodes}"
            )
        per = ep // self.nnodes
        return range(self.node_rank * per, (self.node_rank + 1) * per)


def from_env(env: Mapping[str, str] | None = None) -> tuple[Rendezvous, int, int]:
    """torchrun's environment -> (rendezvous, rank, world size); a missing variable is named."""
    values = {v: dsgraph_env.read(v, env) for v in RENDEZVOUS_ENV}
    missing = [v for v in RENDEZVOUS_ENV if values[v] == dsgraph_env.VARS[v].default]
    if missing:
        raise ValueError(f"torchrun rendezvous: {missing} not set; needs all of {list(RENDEZVOUS_ENV)}")
    rv = Rendezvous(str(values["MASTER_ADDR"]), int(values["MASTER_PORT"]))
    return rv, int(values["RANK"]), int(values["WORLD_SIZE"])


def init_group(rv: Rendezvous, rank: int, ep: int, backend: str, timeout_s: float) -> None:
    """Join the group (gloo on CPU, nccl on GPUs); a collective waiting past `timeout_s` raises."""
    dist.init_process_group(
        backend,
        init_method=f"tcp://{rv.master_addr}:{rv.master_port}",
        rank=rank,
        world_size=ep,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def group_platform(base: Platform, exchange: ExpertExchange) -> Platform:
    """`base`'s rules with dispatch/combine bound to the group (the model graph is unchanged)."""
    rules = {**base.rules, "moe_dispatch": exchange.dispatch, "moe_combine": exchange.combine}
    return dataclasses.replace(base, rules=rules)
