"""`dsgraph serve` options of prefill/decode disaggregation and the KV store (runtime/kvstore): where a
prompt server sends its requests to decode, how handoffs travel, and the store's directory and sizes."""

from __future__ import annotations

import argparse
import socket
from typing import Any

from dsgraph.runtime.kvstore.config import GIB, StoreConfig


def add_pd_arguments(p: argparse.ArgumentParser) -> None:
    d = StoreConfig()
    g = p.add_argument_group("prefill/decode disaggregation and KV store")
    g.add_argument(
        "--pd-peer",
        nargs="+",
        default=None,
        metavar="URL",
        help="--engine-type prompt: the completion servers' URLs (http://host:port); requests decode on the "
        "first, or on the one a router names (dsgraph router --prefill ... --decode ...)",
    )
    g.add_argument(
        "--pd-transport",
        choices=["auto", "mooncake", "torch"],
        default="auto",
        help="handoff transport: Mooncake's transfer engine or torch's TCPStore (auto: Mooncake if it loads)",
    )
    g.add_argument(
        "--pd-timeout", type=float, default=60.0, help="seconds a handoff may take before it fails"
    )
    g.add_argument(
        "--kv-store-path",
        default=None,
        help="directory of the block store shared by the engines of this machine (none: no disk tier; "
        "a prompt engine then sends every page inline)",
    )
    g.add_argument("--kv-store-host-gib", type=float, default=d.host_capacity_bytes / GIB)
    g.add_argument("--kv-store-disk-gib", type=float, default=d.disk_capacity_bytes / GIB)
    g.add_argument("--kv-store-ttl", type=float, default=d.disk_ttl_s, help="seconds a disk block is kept")
    g.add_argument(
        "--kv-store-remote",
        default=None,
        metavar="HOST:PORT",
        help="the cross-machine tier: a Mooncake store master (mooncake_master) every machine's engines join",
    )
    g.add_argument(
        "--kv-store-remote-gib", type=float, default=1.0, help="host memory this process lends to that pool"
    )


def store_from_args(args: argparse.Namespace) -> Any:
    """The TieredStore of --kv-store-path (None without it)."""
    from dsgraph.runtime.kvstore.store import TieredStore

    remote_master = getattr(args, "kv_store_remote", None)
    if args.kv_store_path is None and remote_master is None:
        return None
    remote = None
    if remote_master is not None:
        from dsgraph.runtime.kvstore.remote import MooncakeTier

        segment = int(args.kv_store_remote_gib * GIB)
        remote = MooncakeTier(remote_master, _reachable(args.host), segment, ttl_s=args.kv_store_ttl)
    config = StoreConfig(
        path=args.kv_store_path,
        host_capacity_bytes=int(args.kv_store_host_gib * GIB),
        disk_capacity_bytes=int(args.kv_store_disk_gib * GIB),
        disk_ttl_s=args.kv_store_ttl,
    )
    return TieredStore(config, remote=remote)


def _reachable(host: str) -> str:
    """The address peers reach this process at (a wildcard bind names none)."""
    return host if host not in ("0.0.0.0", "", "::") else socket.gethostbyname(socket.gethostname())


def check_pd_args(args: argparse.Namespace) -> None:
    """ValueError for a combination that cannot serve (named by flag)."""
    if args.engine_type == "prompt" and not args.pd_peer:
        raise ValueError("--engine-type prompt needs --pd-peer (the completion server's URL)")
    if args.engine_type != "prompt" and args.pd_peer:
        raise ValueError(f"--pd-peer is for --engine-type prompt, not {args.engine_type!r}")
    if args.engine_type != "normal" and (args.ep != 1 or args.nnodes != 1):
        raise ValueError("--engine-type prompt/completion runs on one engine (no --ep, --nnodes)")


def pd_loop(args: argparse.Namespace, engine: Any) -> tuple[Any, Any]:
    """(the server's engine loop, the transport) for --engine-type; (None, None) for normal."""
    from dsgraph.runtime.kvstore.transport import make_transport
    from dsgraph.runtime.server.pd_loop import CompletionLoop, PromptLoop

    if args.engine_type == "normal":
        return None, None
    transport = make_transport(args.pd_transport, _reachable(args.host))
    if args.engine_type == "prompt":
        return PromptLoop(engine, args.pd_peer, transport, args.pd_timeout, args.api_key), transport
    return CompletionLoop(engine, args.pd_timeout), transport
