"""Whether zero-overhead (overlapped) scheduling pays on a PROMPT engine, saved as JSON.

Per prompt length: a PROMPT engine with overlap off, then one with overlap on, each prefills the same
`--requests` prompts (queued at once, chunked by --chunk) and exports every handoff (device pages to host
bytes). Reported: wall time until the last handoff, prompt tokens per second, and the on/off speedup; the
first tokens of both runs must agree (greedy), else the run fails. Each handoff copies caches to the host,
which waits for the device, so an overlapped step is serialised at every export: the figure says whether
the planning overlap still wins.

  python -m dsgraph.tools.bench.pd_overlap --platform cuda --bench-model --lengths 4096 16384
  python -m dsgraph.tools.bench.pd_overlap --lengths 64 --requests 4   # the tiny model on CPU
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from dsgraph.tools.bench.pd_handoff import _bench_model_dir, add_model_arguments


def _engine(model: Path, args: argparse.Namespace, overlap: str) -> Any:
    from dsgraph.runtime.engine import Engine, EngineConfig

    config = EngineConfig.from_flat(
        platform=args.platform,
        max_model_len=max(args.lengths) + 16,
        max_num_seqs=args.requests,
        max_num_batched_tokens=args.chunk,
        load_format="dummy" if args.bench_model else "auto",
        engine_type="prompt",
        enable_prefix_cache=False,
        overlap=overlap,
    )
    return Engine(model, config)


def _prefill_all(e: Any, prompts: list[list[int]], platform: str) -> tuple[float, list[int]]:
    """Seconds until every prompt is prefilled and exported; the first token of each."""
    from dsgraph.runtime.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    first: dict[int, int] = {}
    start = time.perf_counter()
    for rid, prompt in enumerate(prompts):
        e.add_request(rid, prompt, params)
    while e.has_unfinished:
        for ev in e.step():
            if ev.token >= 0:
                first[ev.rid] = ev.token
                e.release(ev.rid)
    if platform == "cuda":
        import torch

        torch.cuda.synchronize()
    return time.perf_counter() - start, [first[r] for r in range(len(prompts))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--requests", type=int, default=8, help="prompts prefilled together")
    ap.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens (prefill chunk)")
    ap.add_argument(
        "--out", default=None, help="JSON path (default: bench/results/pd-overlap-<platform>.json)"
    )
    args = ap.parse_args(argv)
    from dsgraph.tools.generate_cmd import default_model_dir

    if args.bench_model:
        import tempfile

        model = _bench_model_dir(Path(tempfile.mkdtemp()) / "bench-model")
    else:
        model = Path(args.model) if args.model else default_model_dir()
    engines = {mode: _engine(model, args, mode) for mode in ("off", "on")}
    rows = []
    for n in args.lengths:
        prompts = [[(7 * i + 13 * k) % 200 + 5 for i in range(n)] for k in range(args.requests)]
        _prefill_all(engines["off"], prompts[:1], args.platform)  # warm-up (graphs, allocator)
        _prefill_all(engines["on"], prompts[:1], args.platform)
        row: dict[str, Any] = {"prompt_tokens": n, "requests": args.requests}
        tokens = {}
        for mode, e in engines.items():
            seconds, tokens[mode] = _prefill_all(e, prompts, args.platform)
            row[f"overlap_{mode}_s"] = seconds
            row[f"overlap_{mode}_tokens_per_s"] = n * args.requests / seconds
        if tokens["on"] != tokens["off"]:
            raise AssertionError(f"overlap changed the first tokens at {n} tokens: {tokens}")
        row["speedup"] = row["overlap_off_s"] / row["overlap_on_s"]
        rows.append(row)
        print(json.dumps(row))
    from dsgraph.tools.bench.meta import commit, device_name

    out = {
        "bench": "pd-overlap",
        "device": device_name(args.platform),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "platform": args.platform,
        "chunk": args.chunk,
        "rows": rows,
    }
    path = Path(args.out or Path("bench/results") / f"pd-overlap-{args.platform}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
