"""Prefill/decode handoff cost and KV store read rates, saved as JSON.

Per prompt length: a PROMPT engine prefills the prompt (timed to its first token), exports the handoff
(device pages to host bytes, store write-through awaited), the payload crosses the transport (publish
and fetch between two transport endpoints of this process, over TCP loopback), the COMPLETION engine
reads its store blocks and admits the request (host bytes to its device pages), then decodes a few
tokens. Bytes per token are the handoff's global (compressed) page bytes over the prompt's tokens, next to
the released formats' value for the model under test and for V4.1-Flash (890).
Store: blocks of one page written through, then read back from the host tier and, from a fresh store over
the same directory, from the disk tier (files possibly still in the OS page cache: a lower bound on an SSD's
time unless --drop-caches can drop it).

  python -m dsgraph.tools.bench.pd_handoff --platform cuda --bench-model --lengths 4096 16384 65536
  python -m dsgraph.tools.bench.pd_handoff --lengths 64 200          # the tiny model on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

EXPERTS = 16  # --bench-model: routed experts kept (the handoff does not depend on the MoE's width)


def _bench_model_dir(root: Path) -> Path:
    """The 8-layer full-width bench model (model_config.py) with few experts, as a config-only dir for
    load_format dummy (the tokenizer falls back to the DeepSeek-V4 one the package ships)."""
    from dsgraph.tools.bench.model_config import bench_config_dict

    cfg = bench_config_dict(engram_vocab=100_000)
    cfg["text_config"]["n_routed_experts"] = EXPERTS
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def _engines(model: Path, args: argparse.Namespace, store: Any) -> tuple[Any, Any]:
    from dsgraph.runtime.engine import Engine, EngineConfig

    def make(kind: str) -> Any:
        config = EngineConfig.from_flat(
            platform=args.platform,
            max_model_len=max(args.lengths) + args.decode_tokens + 16,
            max_num_seqs=1,
            max_num_batched_tokens=args.chunk,
            load_format="dummy" if args.bench_model else "auto",
            engine_type=kind,
            enable_prefix_cache=False,
        )
        return Engine(model, config, store=store)

    return make("prompt"), make("completion")


def _sync(platform: str) -> None:
    if platform == "cuda":
        import torch

        torch.cuda.synchronize()


def _one_length(
    p: Any, c: Any, transports: tuple[Any, Any], n: int, args: argparse.Namespace
) -> dict[str, Any]:
    from dsgraph.runtime.kvstore.handoff import Handoff
    from dsgraph.runtime.kvstore.pd_engines import fetch_pages
    from dsgraph.runtime.kvstore.transport import pack_payload, unpack_payload
    from dsgraph.runtime.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens + 1, ignore_eos=True)
    vocab = p.cfg.text.vocab_size
    prompt = [(17 * i + 11) % (vocab - 10) + 5 for i in range(n)]
    t0 = time.perf_counter()
    p.add_request(n, prompt, params)
    events = []
    while p.has_unfinished:
        events.extend(p.step())
    p.release(n)
    (first,) = [e for e in events if e.token >= 0]
    t1 = time.perf_counter()
    first.handoff.wait_written()
    t2 = time.perf_counter()  # export ran inside the step that sampled the first token
    h = first.handoff.handoff
    payload = pack_payload(h.pack())
    src, dst = transports
    locator = src.publish(str(n), payload)
    got = dst.fetch(locator, 600.0)
    src.discard(str(n))
    h2 = Handoff.unpack(unpack_payload(got, "bench"))
    t3 = time.perf_counter()
    pages = fetch_pages(c, h2)
    t4 = time.perf_counter()
    c.add_prefilled(n, h2, pages, params)
    _sync(args.platform)
    t5 = time.perf_counter()
    decoded = 0
    while c.has_unfinished:
        decoded += sum(e.token >= 0 for e in c.step())
    _sync(args.platform)
    t6 = time.perf_counter()
    c.release(n)
    global_bytes = sum(len(b) for r in pages for b in pages[r])
    page_size = p.model.geo.page_size
    per_token = sum(
        len(pages[r][0]) / (page_size * r) for r in pages if pages[r]
    )  # one page's bytes / its tokens
    return {
        "prompt_tokens": n,
        "prefill_to_first_token_s": t1 - t0,
        "store_write_wait_s": t2 - t1,
        "transfer_s": t3 - t2,
        "transfer_bytes": len(payload),
        "store_read_s": t4 - t3,
        "admit_s": t5 - t4,
        "handoff_total_s": t5 - t1,
        "decode_tokens": decoded,
        "decode_s": t6 - t5,
        "global_bytes": global_bytes,
        "global_bytes_per_token": per_token,  # compare with expected_global_bytes_per_token
        "global_bytes_per_prompt_token": global_bytes / n,  # with the last pages' rounding up
        "slot_bytes": len(h.slot),
        "store_keys": sum(len(k) for k in h.keys.values()),
    }


def _store_rates(path: Path, block_bytes: int, total_bytes: int, drop: bool) -> dict[str, Any]:
    from dsgraph.runtime.kvstore.config import StoreConfig
    from dsgraph.runtime.kvstore.store import TieredStore

    n = max(1, total_bytes // block_bytes)
    keys = [f"{i:040x}" for i in range(n)]
    data = os.urandom(block_bytes)
    cfg = StoreConfig(
        path=str(path), host_capacity_bytes=2 * n * block_bytes, disk_capacity_bytes=2 * n * block_bytes
    )
    store = TieredStore(cfg)
    t0 = time.perf_counter()
    for k in keys:
        store.put(k, data)
    t1 = time.perf_counter()
    for k in keys:
        assert store.get(k) is not None
    t2 = time.perf_counter()
    dropped = False
    if drop:
        subprocess.run(["sync"], check=False)
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            dropped = True
        except OSError:
            pass
    fresh = TieredStore(cfg)
    t3 = time.perf_counter()
    for k in keys:
        assert fresh.get(k) is not None
    t4 = time.perf_counter()
    mb = n * block_bytes / 1e6
    return {
        "block_bytes": block_bytes,
        "blocks": n,
        "write_through_MBps": mb / (t1 - t0),
        "host_read_MBps": mb / (t2 - t1),
        "disk_read_MBps": mb / (t4 - t3),
        "page_cache_dropped": dropped,
    }


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """--model, --bench-model and --platform (shared with the other PD benchmarks)."""
    ap.add_argument("--model", default=None, help="model directory (default: the tiny model)")
    ap.add_argument(
        "--bench-model", action="store_true", help="the full-width 8-layer bench model, dummy weights"
    )
    ap.add_argument("--platform", choices=["cpu", "cuda"], default="cpu")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens (prefill chunk)")
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--transport", choices=["auto", "mooncake", "torch"], default="auto")
    ap.add_argument("--store-dir", default=None, help="block store directory (default: a temporary one)")
    ap.add_argument("--store-mib", type=int, default=64, help="bytes written for the store read rates")
    ap.add_argument(
        "--store-only",
        type=int,
        default=0,
        metavar="BLOCK_BYTES",
        help="measure only the store's rates, with blocks of this size (no engines, no handoff)",
    )
    ap.add_argument(
        "--drop-caches", action="store_true", help="drop the OS page cache before disk reads (root)"
    )
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/pd-handoff-<device>.json)")
    args = ap.parse_args(argv)
    from dsgraph.models.deepseek_v41.config import parse_config
    from dsgraph.models.deepseek_v41.flash import flash_config_dict
    from dsgraph.models.deepseek_v41.layers_plan import layer_plans
    from dsgraph.models.deepseek_v41.step_io import global_bytes_per_token
    from dsgraph.runtime.kvstore.config import StoreConfig
    from dsgraph.runtime.kvstore.store import TieredStore
    from dsgraph.runtime.kvstore.transport import make_transport
    from dsgraph.tools.bench.meta import commit, device_name
    from dsgraph.tools.generate_cmd import default_model_dir

    tmp = Path(tempfile.mkdtemp(prefix="dsgraph-pd-bench-"))
    if args.store_only:
        return _store_only(args, tmp)
    model = _bench_model_dir(tmp / "model") if args.bench_model else Path(args.model or default_model_dir())
    store_dir = Path(args.store_dir) if args.store_dir else tmp / "store"
    store = TieredStore(StoreConfig(path=str(store_dir / "engines")))
    started = time.perf_counter()
    p, c = _engines(model, args, store)
    built_s = time.perf_counter() - started
    print(f"pd_handoff: both engines built in {built_s:.1f} s", flush=True)
    transports = (make_transport(args.transport), make_transport(args.transport))
    text = p.cfg.text
    flash = parse_config(flash_config_dict()).text
    results: dict[str, Any] = {
        "device": device_name(args.platform),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": "bench-8-layer" if args.bench_model else str(model),
        "transport": transports[0].name,
        "expected_global_bytes_per_token": global_bytes_per_token(
            p.model.plans, text.head_dim, text.index_head_dim
        ),
        "flash_global_bytes_per_token": global_bytes_per_token(
            layer_plans(flash), flash.head_dim, flash.index_head_dim
        ),
        "engines_built_s": built_s,
        "handoff": [],
    }
    out = Path(args.out or f"bench/results/pd-handoff-{results['device'].replace(' ', '-')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    for n in args.lengths:  # saved after each length, so a run cut by a time limit keeps what it measured
        results["handoff"].append(_one_length(p, c, transports, n, args))
        out.write_text(json.dumps(results, indent=2))
        print(f"pd_handoff: {n} tokens: {json.dumps(results['handoff'][-1])}", flush=True)
    page = results["handoff"][-1]["global_bytes"] // max(1, results["handoff"][-1]["store_keys"])
    results["store"] = _store_rates(
        store_dir / "rates", max(page, 4096), args.store_mib << 20, args.drop_caches
    )
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"saved {out}")
    return results


def _store_only(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from dsgraph.tools.bench.meta import commit, device_name

    store_dir = Path(args.store_dir) if args.store_dir else tmp / "store"
    results = {
        "device": device_name(args.platform),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "store": _store_rates(store_dir / "rates", args.store_only, args.store_mib << 20, args.drop_caches),
    }
    out = Path(args.out or f"bench/results/pd-store-{results['device'].replace(' ', '-')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
