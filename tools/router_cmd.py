"""`dsgraph router`: one OpenAI/Anthropic endpoint in front of several engines (runtime/router)."""

from __future__ import annotations

import argparse
import logging
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    from dsgraph.runtime.router.config import POLICIES, RouterConfig

    d = RouterConfig(normal=("http://unused:1",))
    p = sub.add_parser("router", help="load balancer in front of dsgraph serve engines (drain, failover)")
    p.add_argument("--normal", nargs="+", default=[], metavar="URL", help="engines that prefill and decode")
    p.add_argument("--prefill", nargs="+", default=[], metavar="URL", help="prompt engines (PD pairs)")
    p.add_argument("--decode", nargs="+", default=[], metavar="URL", help="completion engines (PD pairs)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--policy", choices=POLICIES, default=d.policy, help="balanced: batch size vs KV length")
    p.add_argument(
        "--poll-interval", type=float, default=d.poll_interval_s, help="seconds between /load polls"
    )
    p.add_argument("--max-attempts", type=int, default=d.max_attempts, help="engines a request may try")
    p.add_argument("--kv-per-seq", type=float, default=d.kv_per_seq, help="KV tokens costing one sequence")
    p.add_argument(
        "--prefill-budget", type=float, default=d.prefill_budget_s, help="seconds per prefill chunk"
    )
    p.add_argument(
        "--prefill-cost", default=None, metavar="A,B,C", help="prior prefill cost t(L)=A+B*L+C*L^2 seconds"
    )
    p.add_argument("--prefix-affinity", action="store_true", help="prefer a prompt prefix's engine")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s)
    p.add_argument("--api-key", default=None, help="clients must send this key (it is passed on to engines)")
    p.set_defaults(func=main)


def _config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from dsgraph.runtime.router.config import RouterConfig

    return RouterConfig(
        normal=tuple(args.normal),
        prefill=tuple(args.prefill),
        decode=tuple(args.decode),
        policy=args.policy,
        poll_interval_s=args.poll_interval,
        max_attempts=args.max_attempts,
        kv_per_seq=args.kv_per_seq,
        prefill_budget_s=args.prefill_budget,
        prefix_affinity=args.prefix_affinity,
        request_timeout_s=args.request_timeout,
        api_key=args.api_key,
    )


def _prior(text: str | None):  # type: ignore[no-untyped-def]
    from dsgraph.runtime.router.cost import QuadraticCost
    from dsgraph.runtime.router.select import DEFAULT_PRIOR

    if text is None:
        return DEFAULT_PRIOR
    try:
        a, b, c = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"prefill_cost: {text!r}, expected three numbers A,B,C") from None
    if min(a, b, c) < 0:
        raise ValueError(f"prefill_cost: {text!r}, the coefficients must be >= 0")
    return QuadraticCost(a, b, c)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from dsgraph.runtime.router.app import create_router_app

    try:
        app = create_router_app(_config(args), _prior(args.prefill_cost))
    except ValueError as exc:
        print(f"dsgraph router: {exc}", file=sys.stderr)
        return 2
    # the router's warnings (an attempt that failed and was retried, a stream ended by an error event)
    # with their time, beside uvicorn's own lines
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.WARNING)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)
    return 0
