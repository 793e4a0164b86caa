"""`dsgraph serve`: the OpenAI- and Anthropic-compatible HTTP server (runtime/server) on uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from dsgraph.tools.engine_args import add_engine_args, engine_kwargs
from dsgraph.tools.generate_cmd import default_model_dir


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
    p.set_defaults(func=main)


def _logging() -> None:
    """The request log (one JSON line per request) on stderr beside uvicorn's own lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    log = logging.getLogger("dsgraph.request")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from dsgraph.runtime.engine import Engine, EngineConfig
    from dsgraph.runtime.server.app import create_app
    from dsgraph.runtime.server.protocol import recipe_tokenizer

    root = Path(args.model) if args.model else default_model_dir()
    if not args.model:
        print(f"no --model given: serving the embedded tiny model at {root} (its weights are random)")
    try:
        engine = Engine(root, EngineConfig(**engine_kwargs(args)))
    except (ValueError, FileNotFoundError) as exc:  # a bad option or an absent device: one clear line
        print(f"dsgraph serve: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or root.name
    app = create_app(
        engine,
        name,
        recipe_tokenizer(root),
        thinking=args.thinking,
        api_key=args.api_key,
        allowed_origins=args.allowed_origins,
    )
    _logging()
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)
    finally:
        app.state.server.loop.close()
    return 0
