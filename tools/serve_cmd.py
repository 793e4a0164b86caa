"""`dsgraph serve`: the OpenAI- and Anthropic-compatible HTTP server (runtime/server) on uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from dsgraph.tools.engine_args import add_engine_args, engine_kwargs
from dsgraph.tools.ep_args import add_ep_arguments, ep_from_args
from dsgraph.tools.generate_cmd import default_model_dir
from dsgraph.tools.pd_args import add_pd_arguments, check_pd_args, pd_loop, store_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server (the embedded tiny model without --model)"
    )
    p.add_argument("--model", help="model directory (config.json, tokenizer.json, safetensors)")
    p.add_argument("--served-model-name", help="the model name clients send (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--thinking", action="store_true", help="thinking mode for requests that do not choose")
    p.add_argument(
        "--api-key",
        default=None,
        help="/v1 endpoints need this key (Authorization: Bearer KEY, or x-api-key); default: open",
    )
    p.add_argument(
        "--allowed-origins", nargs="*", default=[], help="CORS: origins browsers may call from ('*': any)"
    )
    add_engine_args(p)
    _add_limits(p)
    add_ep_arguments(p)
    add_pd_arguments(p)
    p.add_argument("--gpu-mem", type=float, default=None, help="GiB per GPU to plan for (default: the GPU's)")
    p.set_defaults(func=main)


def _logging() -> None:
    """The request log (one JSON line per request) on stderr beside uvicorn's own lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    log = logging.getLogger("dsgraph.request")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _add_limits(p: argparse.ArgumentParser) -> None:
    from dsgraph.runtime.server.limits import DEFAULT_GRACE_S, ServerLimits

    d = ServerLimits()
    p.add_argument("--max-request-body-bytes", type=int, default=d.max_body_bytes, help="larger: 413")
    p.add_argument("--max-json-depth", type=int, default=d.max_json_depth, help="deeper request JSON: 400")
    p.add_argument("--max-json-array-items", type=int, default=d.max_array_items, help="longer arrays: 400")
    p.add_argument(
        "--prepare-workers", type=int, default=d.prepare_workers, help="request preparation threads"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_GRACE_S,
        help="seconds SIGTERM waits for requests in flight before closing every connection",
    )
    p.add_argument("--enable-openapi", action="store_true", help="serve /openapi.json (off by default)")
    p.add_argument(
        "--check-weights",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check every weight is finite at load (default: only for checkpoints up to 2 GiB)",
    )


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from dsgraph.runtime.engine import Engine, EngineConfig
    from dsgraph.runtime.server.app import create_app
    from dsgraph.runtime.server.lifecycle import DrainingServer
    from dsgraph.runtime.server.limits import ServerLimits
    from dsgraph.runtime.server.protocol import recipe_tokenizer

    limits = ServerLimits(
        max_body_bytes=args.max_request_body_bytes,
        max_json_depth=args.max_json_depth,
        max_array_items=args.max_json_array_items,
        prepare_workers=args.prepare_workers,
    )

    root = Path(args.model) if args.model else default_model_dir()
    if not args.model:
        print(f"no --model given: serving the embedded tiny model at {root} (its weights are random)")
    try:
        config = EngineConfig.from_flat(**engine_kwargs(args))  # with --check-weights
        check_pd_args(args)
        refuse_unless_fits(args, root)
        single = args.ep == 1 and args.nnodes == 1
        store = store_from_args(args)
        engine = Engine(root, config, store=store) if single else _group_engine(args, root, config)
        loop, transport = pd_loop(args, engine)
    except (ValueError, FileNotFoundError) as exc:  # a bad option or an absent device: one clear line
        print(f"dsgraph serve: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or root.name
    tok = recipe_tokenizer(root, engine.cfg.text.vocab_size)
    app = create_app(
        engine,
        name,
        tok,
        thinking=args.thinking,
        api_key=args.api_key,
        allowed_origins=args.allowed_origins,
        limits=limits,
        enable_openapi=args.enable_openapi,
        loop=loop,
    )
    if args.engine_type != "normal":
        from dsgraph.runtime.server.pd_app import install_pd

        install_pd(app, args.engine_type, transport, store, args.pd_timeout)
    elif store is not None:  # a normal engine with a store: its hits and write-through per tier
        from dsgraph.runtime.server.pd_metrics import register_pd_metrics

        register_pd_metrics(app.state.server.metrics.registry, store, None)
    _logging()
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    server = DrainingServer(uv_config, app.state.server.drain)
    app.state.on_drained = lambda: setattr(server, "should_exit", True)  # POST /admin/drain, then exit
    try:
        server.run()
    finally:
        app.state.server.close()
        close = getattr(engine, "close", None)  # an EP group's engine ends its rank processes
        if close is not None:
            close()
    return 0


def _group_engine(args: argparse.Namespace, root: Path, config: object) -> object:
    """--ep N: N rank processes behind this process's API (runtime/distributed/front.py). A node other
    than 0 runs its ranks and relays node 0's requests to them (runtime/distributed/nodes.py) until the
    group ends."""
    from dsgraph.runtime.distributed.front import GroupEngine

    ep, rv = ep_from_args(args)
    engine = GroupEngine(root, config, ep, rv)
    if rv.node_rank != 0:
        from dsgraph.runtime.distributed.nodes import relay

        print(f"node {rv.node_rank}: ranks {list(rv.ranks_here(ep.ep))} joined the group at {rv.master_addr}")
        relay(engine.group, rv, engine.usage, ep.timeout_s)  # until node 0 or a rank ends the group
        raise SystemExit(0)
    return engine


def refuse_unless_fits(args: argparse.Namespace, root: Path) -> None:
    """Stop before loading anything when this machine's GPUs cannot hold the plan (the `dsgraph plan`
    breakdown says why), or when there are more ranks than GPUs."""
    from dsgraph.models.deepseek_v41.config import load_config
    from dsgraph.models.registry import family_for
    from dsgraph.platform.devices import device_count, device_memory_bytes
    from dsgraph.runtime.distributed.plan import GIB, PlanRequest, plan
    from dsgraph.tools.ep_args import check_gpus

    ep, rv = ep_from_args(args)
    available = device_count(args.platform)
    if available:  # no device at all: the engine names the missing platform (DeviceUnavailable)
        check_gpus(ep, rv, available)
    mem = args.gpu_mem * GIB if args.gpu_mem is not None else device_memory_bytes(args.platform)
    if mem is None or family_for(root).model_type != "deepseek_v41":  # `dsgraph plan` knows V4.1 only
        return
    try:
        req = PlanRequest(
            gpus=ep.ep,
            ep=ep.ep,
            gpu_mem_gib=mem / GIB,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            extra_experts=ep.extra_experts,
        )
        p = plan(load_config(root / "config.json"), req)
    except ValueError as exc:
        raise SystemExit(f"dsgraph serve: {exc}") from None
    if not p.fits:
        raise SystemExit(f"dsgraph serve: the model does not fit; the plan:\n{p.as_text()}")
