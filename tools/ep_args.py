"""The expert-parallel options of `serve` and `generate`: --ep and the rendezvous (or torchrun's
MASTER_ADDR / MASTER_PORT)."""

from __future__ import annotations

import argparse

from dsgraph.platform import env
from dsgraph.runtime.distributed.config import EPConfig
from dsgraph.runtime.distributed.group import Rendezvous


def add_ep_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("expert parallelism")
    g.add_argument(
        "--ep", type=int, default=1, help="rank processes: data-parallel attention, expert-parallel MoE"
    )
    g.add_argument("--nnodes", type=int, default=1, help="machines of the group")
    g.add_argument("--node-rank", type=int, default=0, help="this machine's index (0 serves the API)")
    g.add_argument("--master-addr", default=None, help="node 0's address (default: $MASTER_ADDR, else local)")
    g.add_argument(
        "--master-port", type=int, default=None, help="rendezvous port (default: $MASTER_PORT, else free)"
    )
    g.add_argument("--eplb-interval", type=int, default=None, help="steps between EPLB rebalances (0: never)")
    g.add_argument("--eplb-window", type=int, default=None, help="steps of expert counts a rebalance uses")
    g.add_argument("--extra-experts", type=int, default=None, help="redundant experts per MoE, a lower bound")
    g.add_argument(
        "--ep-capacity",
        type=int,
        default=None,
        help="rows per rank pair of the MoE exchange, padded (static shapes); a layer needing more takes the "
        "exact dynamic exchange (default 0: exactly the routed rows)",
    )


def ep_from_args(args: argparse.Namespace) -> tuple[EPConfig, Rendezvous]:
    """Validated options; SystemExit names the option and the allowed values."""
    try:
        addr = args.master_addr or str(env.read("MASTER_ADDR")) or None
        port = args.master_port if args.master_port is not None else int(env.read("MASTER_PORT"))
        if args.nnodes > 1 and not addr:
            raise ValueError(
                f"--master-addr (or $MASTER_ADDR) is required with --nnodes {args.nnodes}: node 0's address"
            )
        if args.nnodes > 1 and not port:
            raise ValueError(
                f"--master-port (or $MASTER_PORT) is required with --nnodes {args.nnodes}: 1..65535"
            )
        rv = Rendezvous(addr or "127.0.0.1", port, args.nnodes, args.node_rank)
        given = {
            "interval": args.eplb_interval,
            "window": args.eplb_window,
            "extra_experts": args.extra_experts,
            "capacity": args.ep_capacity,
        }
        ep = EPConfig(ep=args.ep, **{k: v for k, v in given.items() if v is not None})
        rv.ranks_here(ep.ep)
    except ValueError as exc:
        raise SystemExit(f"dsgraph {args.command}: {exc}") from None
    return ep, rv


def check_gpus(ep: EPConfig, rv: Rendezvous, available: int) -> None:
    """A cuda group runs one rank per GPU of each node."""
    per_node = ep.ep // rv.nnodes
    if per_node > available:
        raise SystemExit(
            f"dsgraph: --ep {ep.ep} over --nnodes {rv.nnodes} puts {per_node} ranks on this machine, "
            f"which has {available} GPUs; allowed: --ep 1..{available * rv.nnodes}"
        )
