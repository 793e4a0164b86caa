"""`dsgraph generate`: generate text with the offline API, on a model directory or the embedded tiny model."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from dsgraph.platform import env
from dsgraph.tools.engine_args import add_engine_args, engine_kwargs
from dsgraph.tools.ep_args import add_ep_arguments, ep_from_args

DEFAULT_PROMPT = "w1 W2 w3 w4"


def default_model_dir() -> Path:
    """The embedded default: a tiny random checkpoint in the released format, made once per cache dir."""
    root = env.cache_home() / "dsgraph" / "tiny-v41-seed0"
    if not (root / "config.json").exists():
        _make_default(root)
    return root


def _make_default(root: Path) -> None:
    """Written beside `root` and renamed into place, so that processes starting together (test workers,
    EP ranks) never read a half-written checkpoint; the first rename wins and the others discard theirs."""
    import os
    import shutil
    import tempfile

    from dsgraph.models.deepseek_v41.tiny import make_tiny

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        make_tiny(tmp, seed=0)
        os.rename(tmp, root)
    except OSError:
        if not (root / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text (the embedded tiny random model without --model)")
    p.add_argument("--model", help="model directory (config.json, tokenizer.json, safetensors)")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="a file with one prompt per line")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--min-tokens", type=int, default=0, help="no EOS or stop before this many tokens")
    add_engine_args(p)
    add_ep_arguments(p)
    p.set_defaults(func=main)


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        prompts += [line for line in Path(args.prompts_file).read_text().splitlines() if line.strip()]
    return prompts or [DEFAULT_PROMPT]


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dsgraph.runtime.llm import LLM
    from dsgraph.runtime.sampling_params import RequestError

    if not args.model:
        where = default_model_dir()
        print(f"no --model given: using the embedded tiny model at {where} (its weights are random)")
    if args.ep != 1 or args.nnodes != 1:
        return _main_group(args)
    try:
        if args.engine_type != "normal":  # a pair needs two servers (README, prefill/decode)
            raise ValueError(f"--engine-type {args.engine_type}: generate runs a normal engine; use serve")
        params = _params(args)
        llm = LLM(args.model, **engine_kwargs(args))
        params.validate(llm.engine.cfg.text.vocab_size)
    except (RequestError, ValueError) as exc:
        print(f"dsgraph generate: {exc}", file=sys.stderr)
        return 2
    prompts = _prompts(args)
    start, generated, finals = time.perf_counter(), 0, {}
    bar = tqdm(total=len(prompts) * args.max_tokens, unit="tok", disable=not sys.stderr.isatty())
    for index, _text, out in llm.stream(prompts, params):
        finals[index] = out
        generated += 1 if out.error is None else 0
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    for i, prompt in enumerate(prompts):
        out = finals[i]
        shown = (
            f"error: {out.error}"
            if out.error
            else f"{out.outputs[0].text!r} ({out.outputs[0].finish_reason})"
        )
        print(f"prompt: {prompt!r}\noutput: {shown}")
    prompt_tokens = sum(len(finals[i].prompt_token_ids) for i in range(len(prompts)))
    print(
        f"{generated} tokens generated for {prompt_tokens} prompt tokens in {seconds:.2f} s "
        f"({generated / seconds:.1f} tokens/s)"
    )
    looked_up, hit = llm.engine.prefix_cache_stats()
    print(
        f"prefix cache: {hit} of {looked_up} prompt tokens served from cache ({hit / max(looked_up, 1):.0%})"
    )
    _print_spec_stats(llm.engine.spec_stats())
    return 0 if all(f.error is None for f in finals.values()) else 2


def _print_spec_stats(stats: dict[str, object] | None) -> None:
    """One line of DSpark statistics (nothing with drafting off)."""
    if stats is None:
        return

    def fmt(x: object) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    positions = " ".join(fmt(r) for r in stats["position_accept_rate"])  # type: ignore[attr-defined]
    print(
        f"speculative ({stats['mode']}): {stats['accepted_tokens']} of {stats['verified_tokens']} drafts "
        f"accepted (rate {fmt(stats['accept_rate'])}, per position {positions}), mean accepted length "
        f"{fmt(stats['mean_accepted_len'])}, confidence calibration error {fmt(stats['calibration_ece'])}"
    )


def _main_group(args: argparse.Namespace) -> int:
    """--ep N: the prompts spread over N rank processes (runtime/distributed); outputs in prompt order."""
    from dsgraph.runtime.distributed.dp import EPRunner

    ep, rv = ep_from_args(args)
    params, config = _params(args), engine_kwargs(args)
    runner = EPRunner(args.model or default_model_dir(), ep, config, rv)
    try:
        prompts = _prompts(args) if rv.node_rank == 0 else []
        outs = runner.generate(prompts, params)
        for prompt, out in zip(prompts, outs, strict=True):
            shown = (
                f"error: {out.error}"
                if out.error
                else f"{out.outputs[0].text!r} ({out.outputs[0].finish_reason})"
            )
            print(f"prompt: {prompt!r}\noutput: {shown}")
        stats = runner.call(rank_load_stats)
        worst = max(s["imbalance"] for s in stats)
        print(f"expert parallel: {ep.ep} ranks, EPLB imbalance (slowest rank / mean) {worst:.3f}")
    finally:
        runner.close()
    return 0 if all(o.error is None for o in outs) else 2


def rank_load_stats(setup: object, _engine: object) -> dict[str, float]:
    """Every rank at once (a collective): the window's imbalance now, then the rank's figures."""
    setup.measure()  # type: ignore[attr-defined]
    return setup.load_stats()  # type: ignore[attr-defined]


def _params(args: argparse.Namespace) -> Any:
    from dsgraph.runtime.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        seed=args.seed,
    )
