"""`dsgraph bench v4`: DeepSeek-V4-Flash at full width, truncated to a few layers, on one GPU: dsgraph,
transformers' DeepseekV4ForCausalLM and vLLM, one after the other on the same random checkpoint (each in
its own process, so one engine's memory never limits the next). Writes one JSON with every engine's
prefill time, decode throughput, and dsgraph's ratios to the others.

The checkpoint is written once (`--dir`) in the released layout: weights sampled and quantized on the GPU.
Without `--config` the schedule is transformers' default for the given layer count; pass the release's
config.json to truncate its schedule instead. An engine that fails records its error in the JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dsgraph.platform import env
from dsgraph.tools.bench.meta import commit

ENGINES = ("dsgraph", "transformers", "vllm")


def bench_config(layers: int, config: str | None) -> dict[str, Any]:
    from dsgraph.models.deepseek_v4.config_defaults import (
        DEFAULTS,
        RELEASE_QUANT,
        RELEASE_YARN,
        default_ratios,
    )

    base = json.loads(Path(config).read_text()) if config else {}
    cfg = {**{k: v for k, v in DEFAULTS.items() if v is not None}, **base}
    cfg.update(model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"], num_hidden_layers=layers)
    cfg["compress_ratios"] = list(base.get("compress_ratios", default_ratios(layers)))[:layers]
    cfg.pop("layer_types", None)
    cfg.setdefault("rope_scaling", dict(RELEASE_YARN))
    cfg.setdefault("quantization_config", dict(RELEASE_QUANT))
    # the release's config names the router's method; vLLM creates the routing bias only when it is named
    # (without it vLLM's non-hash layers route through a plain top-k that rejects sqrtsoftplus); dsgraph
    # and transformers read the bias from the checkpoint either way
    cfg.setdefault("topk_method", "noaux_tc")
    cfg["num_nextn_predict_layers"] = 0
    # a truncated model keeps the release's leading hash-routed layers, as many as it has layers
    cfg["num_hash_layers"] = min(int(cfg.get("num_hash_layers", 0)), layers)
    return cfg


def write_checkpoint_on_gpu(out: Path, cfg_dict: dict[str, Any], device: str = "cuda") -> Path:
    import torch

    from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors
    from dsgraph.models.deepseek_v4.config import parse_config
    from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype, write_checkpoint
    from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, scale_name
    from dsgraph.models.deepseek_v41.tiny import quantize_tensor, sample_weight
    from dsgraph.models.deepseek_v41.tokenizer_fixture import fixture_tokenizer

    cfg = parse_config(cfg_dict)
    gen = torch.Generator(device).manual_seed(0)
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    tensors: dict[str, torch.Tensor] = {}
    for name, spec in expected_tensors(cfg).items():
        if spec.kind is TensorKind.SCALE:
            continue
        if name.endswith("tid2eid"):
            noise = torch.rand(spec.shape[0], cfg.text.n_routed_experts, generator=gen, device=device)
            tensors[name] = noise.argsort(dim=1)[:, : spec.shape[1]].cpu()
            continue
        w = sample_weight(name, spec.logical_shape, gen)
        if spec.kind is TensorKind.PLAIN:
            tensors[name] = w.to(torch_dtype(spec.dtype)).cpu()
        else:
            q, s = quantize_tensor(spec, w, block)
            tensors[name], tensors[scale_name(name)] = q.cpu(), s.cpu()
    write_checkpoint(out, tensors, cfg_dict, num_shards=4)
    fixture_tokenizer("tiny", cfg.text.vocab_size).save(str(out / "tokenizer.json"))
    return out


def _prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab, (args.batch, args.prompt_len), generator=gen).tolist()


def _timed(fn: Any) -> float:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _result(args: argparse.Namespace, prefill_s: float, generate_s: float) -> dict[str, Any]:
    decode_s = max(generate_s - prefill_s, 1e-9)
    return {
        "prefill_s": prefill_s,
        "prefill_tokens_per_s": args.batch * args.prompt_len / prefill_s,
        "generate_s": generate_s,
        "decode_tokens_per_s": args.batch * (args.decode_tokens - 1) / decode_s,
    }


def run_dsgraph(args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, Any]:
    from dsgraph import LLM, SamplingParams

    llm = LLM(str(args.dir), platform=args.platform, max_model_len=args.prompt_len + args.decode_tokens + 8,
              max_num_seqs=args.batch, enable_prefix_cache=False)  # fmt: skip
    batch = [{"prompt_token_ids": p} for p in prompts]
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0, max_tokens=args.decode_tokens, ignore_eos=True)
    llm.generate(batch, full)  # warm-up: captures every bucket once
    return _result(args, _timed(lambda: llm.generate(batch, one)), _timed(lambda: llm.generate(batch, full)))


def run_transformers(args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, Any]:
    import torch

    from dsgraph.models.deepseek_v4.config import load_config
    from dsgraph.tools.bench.v4_transformers import load_tf_model

    cfg_dict = json.loads((args.dir / "config.json").read_text())
    device = "cuda" if args.platform == "cuda" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = load_tf_model(args.dir, cfg_dict, load_config(args.dir), dtype=dtype, device=device)
    ids = torch.tensor(prompts, device=device)
    kw = dict(max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens, do_sample=False)
    # transformers 5.17's decoder layer hands its FP32 hyper-connection output to BF16 projections (a
    # dtype error at BF16): autocast runs those matmuls in BF16, as the weights are stored
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    with torch.no_grad(), autocast:
        model.generate(ids, **kw)  # warm-up
        prefill = _timed(lambda: model(input_ids=ids, use_cache=True))
        generate = _timed(lambda: model.generate(ids, **kw))
    return _result(args, prefill, generate)


_VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not installed beside vLLM on the GPU machine
    # vLLM's start-up is minutes of torch.compile and kernel JIT; with its caches in one place a later
    # start (or a machine the caches are copied to) skips them
    "VLLM_CACHE_ROOT": "/tmp/vllm_cache",
    "DG_JIT_CACHE_DIR": "/tmp/vllm_cache/deep_gemm",
    "TILELANG_CACHE_DIR": "/tmp/vllm_cache/tilelang",
    "TRITON_CACHE_DIR": "/tmp/vllm_cache/triton",
    "CUDA_HOME": "/usr/local/cuda",  # nvcc for DeepGEMM's and TileLang's JIT
    # vLLM's start-up compiles kernels ahead of use: its JIT warmup (349 s on one H100 for 4 layers) and
    # DeepGEMM's for every M up to the token budget (1,724 more); run_vllm's untimed generate runs the
    # timed shapes first and compiles what they use, so skipping both changes no timed figure
    "VLLM_DEEP_GEMM_WARMUP": "skip",
}


def run_vllm(args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, Any]:
    """vLLM on the same config.json with its own random weights (`load_format="dummy"`): the times
    depend on the shapes, not on the values, and vLLM's reader of the released layout is not under
    test here. Token ids in, token ids out: no tokenizer."""
    env.set_peer_defaults(_VLLM_ENV)
    import vllm

    llm = vllm.LLM(model=str(args.dir), max_model_len=args.prompt_len + args.decode_tokens + 8,
                   max_num_seqs=args.batch, enable_prefix_caching=False, load_format="dummy",
                   skip_tokenizer_init=True, kernel_config={"enable_jit_warmup": False})  # fmt: skip
    batch = [{"prompt_token_ids": p} for p in prompts]
    same = dict(temperature=0, ignore_eos=True, detokenize=False)
    one = vllm.SamplingParams(max_tokens=1, **same)
    full = vllm.SamplingParams(max_tokens=args.decode_tokens, min_tokens=args.decode_tokens, **same)
    llm.generate(batch, full)
    return {"version": vllm.__version__, "weights": "dummy",
            **_result(args, _timed(lambda: llm.generate(batch, one)),
                      _timed(lambda: llm.generate(batch, full)))}  # fmt: skip


def _child(args: argparse.Namespace) -> int:
    """One engine's measurement, printed as one JSON line (run in its own process)."""
    from dsgraph.models.deepseek_v4.config import load_config

    args.dir = Path(args.dir)
    prompts = _prompts(args, load_config(args.dir).text.vocab_size)
    runner = {"dsgraph": run_dsgraph, "transformers": run_transformers, "vllm": run_vllm}[args.engine]
    print("\nRESULT " + json.dumps(runner(args, prompts)), flush=True)  # own line after progress bars
    return 0


def _tail(log: Path, n: int = 2000) -> str:
    return log.read_text(errors="replace")[-n:]


def _measure(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """Runs one engine in its own process. Its output (vLLM logs to stdout) goes to a log beside --out, so
    that a run cut off by --timeout-s still says how far it got (vLLM's start-up takes minutes of JIT)."""
    cmd = [sys.executable, "-m", "dsgraph.tools.bench.v4_bench", "--engine", engine, "--dir", str(args.dir)]
    cmd += ["--batch", str(args.batch), "--prompt-len", str(args.prompt_len)]
    cmd += ["--decode-tokens", str(args.decode_tokens), "--platform", args.platform]
    out = Path(args.out)
    log = out.with_name(f"{out.stem}.{engine}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        try:
            done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"no result within --timeout-s {args.timeout_s:g}; {log}: " + _tail(log)}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    return {"error": _tail(log), "returncode": done.returncode}


def _previous(out: Path, shape: dict[str, int], cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """Results of earlier runs into the same JSON with the same shape and model (engines may be measured
    one per command, each under a device's per-command time limit)."""
    if not out.is_file():
        return {}
    old = json.loads(out.read_text())
    same = old.get("shape") == shape and old.get("config") == _config_summary(cfg_dict)
    return dict(old.get("results", {})) if same else {}


def _config_summary(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """What identifies the measured model in the JSON (None for a field a written config lacks)."""
    return {k: cfg_dict.get(k) for k in ("num_hidden_layers", "hidden_size", "compress_ratios")}


def check_engines(engines: list[str], cfg_dict: dict[str, Any]) -> None:
    """Refuses, before minutes of checkpoint writing and JIT, a run that an engine is known to reject."""
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise SystemExit(f"bench v4: --engines: unknown {unknown}; choose from {ENGINES}")
    ratios = cfg_dict["compress_ratios"]
    if "vllm" in engines and 4 not in ratios:
        # seen on the H200 with vLLM 0.33.0: its KV-cache planner sizes every layer's pages from the CSA
        # (ratio-4) layers' and fails on an HCA-only schedule with "page size is not divisible by the
        # maximum page size and cannot be padded"
        raise SystemExit(
            f"bench v4: engine vllm needs a ratio-4 layer in compress_ratios, got {ratios}: vLLM 0.33.0 "
            "cannot plan the KV cache of an HCA-only schedule; use --layers >= 4 or a --config whose "
            "schedule has a 4"
        )


def _check_written(ckpt: Path, cfg_dict: dict[str, Any]) -> None:
    """A --dir written for another model would be measured silently in its place."""
    have, want = _config_summary(json.loads((ckpt / "config.json").read_text())), _config_summary(cfg_dict)
    if have != want:
        raise SystemExit(
            f"bench v4: --dir {ckpt} holds a checkpoint of {have}, not of the requested {want}; give "
            "another --dir (it is written when absent)"
        )


def run(args: argparse.Namespace) -> int:
    args.dir = Path(args.dir)
    cfg_dict = bench_config(args.layers, args.config)
    engines = [e for e in args.engines.split(",") if e]
    check_engines(engines, cfg_dict)
    if (args.dir / "config.json").is_file():
        _check_written(args.dir, cfg_dict)
    else:
        write_checkpoint_on_gpu(args.dir, cfg_dict, "cuda" if args.platform == "cuda" else "cpu")
    shape = {"batch": args.batch, "prompt_len": args.prompt_len, "decode_tokens": args.decode_tokens}
    results = _previous(Path(args.out), shape, cfg_dict)
    results.update({e: _measure(args, e) for e in engines})
    ours = results.get("dsgraph", {})
    ratios = {
        f"dsgraph_vs_{e}": {
            k: ours[k] / r[k] for k in ("prefill_tokens_per_s", "decode_tokens_per_s") if k in ours and k in r
        }
        for e, r in results.items()
        if e != "dsgraph"
    }
    import torch

    out = {
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "config": _config_summary(cfg_dict),
        "shape": shape,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "results": results,
        "ratios": ratios,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(ratios, indent=2))
    print(f"wrote {args.out}")
    return 0


def _shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default="build/v4-bench", help="the random checkpoint (written if absent)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--platform", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke run of the tool")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "v4", help="DeepSeek-V4-Flash (truncated, full width): dsgraph vs transformers vs vLLM"
    )
    _shape_args(p)
    p.add_argument("--layers", type=int, default=4, help="backbone layers of the truncated model")
    p.add_argument("--config", help="a V4-Flash config.json whose schedule and sizes to truncate")
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated subset of {ENGINES} ('' only writes the checkpoint); results of earlier runs "
        "into the same --out with the same shape are kept",
    )
    p.add_argument("--timeout-s", type=float, default=900.0, help="per engine")
    p.add_argument("--out", default="bench/results/v4-compare.json")
    p.set_defaults(func=run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    _shape_args(parser)
    parser.add_argument("--engine", choices=ENGINES, required=True)
    sys.exit(_child(parser.parse_args()))
