"""`dsgraph serve`: the OpenAI-compatible HTTP server (runtime/server) on uvicorn."""

from __future__ import annotations

import argparse
from pathlib import Path

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
    _add_limits(p)
    p.set_defaults(func=main)


def _add_limits(p: argparse.ArgumentParser) -> None:
    from dsgraph.runtime.server.lifecycle import DEFAULT_GRACE_S
    from dsgraph.runtime.server.limits import ServerLimits

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
    config = EngineConfig(
        numerics=args.numerics,
        platform=args.platform,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        check_weights=args.check_weights,
    )
    engine = Engine(root, config)
    name = args.served_model_name or root.name
    tok = recipe_tokenizer(root, engine.cfg.text.vocab_size)
    app = create_app(
        engine, name, tok, thinking=args.thinking, limits=limits, enable_openapi=args.enable_openapi
    )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=args.shutdown_timeout
    )
    server = DrainingServer(config, app.state.server.drain)
    try:
        server.run()
    finally:
        app.state.server.close()
    return 0
