"""`dsgraph serve`: the OpenAI-compatible HTTP server (runtime/server) on uvicorn."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dsgraph.tools.ep_args import add_ep_arguments, ep_from_args
from dsgraph.tools.generate_cmd import default_model_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server (the embedded tiny model without --model)"
    )
    p.add_argument("--model", help="model directory (config.json, tokenizer.json, safetensors)")
    p.add_argument("--served-model-name", help="the model name clients send (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--numerics", choices=["serving", "reference"], default="serving")
    p.add_argument("--platform", choices=["cpu", "cuda"], default="cpu", help="cuda: GPU kernels, graphs")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--thinking", action="store_true", help="thinking mode for requests that do not choose")
    add_ep_arguments(p)
    p.add_argument("--gpu-mem", type=float, default=None, help="GiB per GPU to plan for (default: the GPU's)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from dsgraph.runtime.engine import Engine, EngineConfig
    from dsgraph.runtime.server.app import create_app
    from dsgraph.runtime.server.protocol import recipe_tokenizer

    root = Path(args.model) if args.model else default_model_dir()
    if not args.model:
        print(f"no --model given: serving the embedded tiny model at {root} (its weights are random)")
    config = EngineConfig(
        numerics=args.numerics,
        platform=args.platform,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
    )
    refuse_unless_fits(args, root)
    engine = Engine(root, config) if args.ep == 1 and args.nnodes == 1 else _group_engine(args, root, config)
    name = args.served_model_name or root.name
    app = create_app(engine, name, recipe_tokenizer(root), thinking=args.thinking)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        app.state.server.loop.close()
        if hasattr(engine, "runner"):
            engine.close()
    return 0


def _group_engine(args: argparse.Namespace, root: Path, config: object) -> object:
    """--ep N: N rank processes behind this process's API (runtime/distributed/front.py). A node other
    than 0 runs its ranks (experts and dummy rounds) until the group ends."""
    from dsgraph.runtime.distributed.front import GroupEngine

    ep, rv = ep_from_args(args)
    engine = GroupEngine(root, config, ep, rv)
    if rv.node_rank != 0:
        print(f"node {rv.node_rank}: ranks {list(rv.ranks_here(ep.ep))} joined the group at {rv.master_addr}")
        while True:
            engine.group.check()
            time.sleep(1.0)
    return engine


def refuse_unless_fits(args: argparse.Namespace, root: Path) -> None:
    """Stop before loading anything when this machine's GPUs cannot hold the plan (the `dsgraph plan`
    breakdown says why), or when there are more ranks than GPUs."""
    from dsgraph.models.deepseek_v41.config import load_config
    from dsgraph.platform.devices import device_count, device_memory_bytes
    from dsgraph.runtime.distributed.plan import GIB, PlanRequest, plan
    from dsgraph.tools.ep_args import check_gpus

    ep, rv = ep_from_args(args)
    available = device_count(args.platform)
    if available is not None:
        check_gpus(ep, rv, available)
    mem = args.gpu_mem * GIB if args.gpu_mem is not None else device_memory_bytes(args.platform)
    if mem is None:
        return
    try:
        req = PlanRequest(
            gpus=ep.ep,
            ep=ep.ep,
            gpu_mem_gib=mem / GIB,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            extra_experts=ep.extra_experts,
        )
        p = plan(load_config(root / "config.json"), req)
    except ValueError as exc:
        raise SystemExit(f"dsgraph serve: {exc}") from None
    if not p.fits:
        raise SystemExit(f"dsgraph serve: the model does not fit; the plan:\n{p.as_text()}")
