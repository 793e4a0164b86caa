"""`dsgraph plan`: bytes per GPU by kind for a model on N GPUs, whether it fits, and the fewest GPUs that
do (runtime/distributed/plan.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dsgraph.runtime.engine_config import EngineConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="memory per GPU (weights, experts, caches, graphs) and whether it fits")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model directory (its config.json)")
    src.add_argument("--flash", action="store_true", help="the released DeepSeek-V4.1-Flash config")
    p.add_argument("--gpus", type=int, required=True, help="GPUs to plan for")
    p.add_argument("--gpu-mem", type=float, default=None, help="GiB per GPU (default: an H200's 140)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel size (default: --gpus)")
    d = EngineConfig()  # the engine's defaults: a plan without these flags is the engine's
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--max-num-seqs", type=int, default=d.scheduler.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=d.scheduler.max_num_batched_tokens)
    p.add_argument("--extra-experts", type=int, default=None, help="redundant experts, a lower bound")
    p.set_defaults(func=main)


def request(args: argparse.Namespace, gpus: int) -> object:
    from dsgraph.runtime.distributed.config import DEFAULT_EXTRA_EXPERTS
    from dsgraph.runtime.distributed.plan import H200_GIB, PlanRequest

    return PlanRequest(
        gpus=gpus,
        ep=args.ep if args.ep is not None else gpus,
        gpu_mem_gib=args.gpu_mem if args.gpu_mem is not None else H200_GIB,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        extra_experts=args.extra_experts if args.extra_experts is not None else DEFAULT_EXTRA_EXPERTS,
    )


def load(args: argparse.Namespace) -> object:
    from dsgraph.models.deepseek_v41.config import load_config, parse_config
    from dsgraph.models.deepseek_v41.flash import flash_config_dict

    return parse_config(flash_config_dict()) if args.flash else load_config(Path(args.model) / "config.json")


def main(args: argparse.Namespace) -> int:
    from dsgraph.runtime.distributed.plan import model_bytes, plan, smallest_fit

    try:
        req = request(args, args.gpus)
    except ValueError as exc:
        raise SystemExit(f"dsgraph plan: {exc}") from None
    cfg = load(args)
    base = model_bytes(cfg, req)
    try:
        p = plan(cfg, req, base)
    except ValueError as exc:
        raise SystemExit(f"dsgraph plan: {exc}") from None
    print(p.as_text(), end="")
    n = smallest_fit(cfg, req, base=base)
    print(f"smallest GPU count that fits (EP = GPUs): {n}" if n else "no GPU count up to 64 fits")
    return 0 if p.fits else 1
