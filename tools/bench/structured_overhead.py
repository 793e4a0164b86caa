"""Per-step cost of constrained decoding at the real vocabulary (129280 tokens): for batches of 1 and 64
rows, all constrained by a JSON Schema, the host's mask fill (XGrammar), the mask's upload, the matchers'
token updates, and the sampling op with and without the mask; written as JSON.

    python -m dsgraph.tools.bench.structured_overhead --platform cpu --out bench/results/...json
    (--platform cuda: logits and sampling on the GPU, the mask uploaded there)
"""

from __future__ import annotations

import argparse
import json
import platform as host
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dsgraph.models.deepseek_v41.tokenizer_fixture import DEEPSEEK_VOCAB_SIZE, fixture_tokenizer
from dsgraph.runtime.sampler import Sampler
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.structured.compiler import GrammarCache, vocabulary
from dsgraph.runtime.structured.params import StructuredOutputsParams
from dsgraph.runtime.structured.state import StructuredState

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "tags"],
}
PREFIX = '{"name": "ab'  # the matchers stand inside a string: a large allowed set, the costly case


def _ms(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) * 1e3 / reps


def measure(rows: int, device: torch.device, cache: GrammarCache, reps: int) -> dict[str, float]:
    tok = fixture_tokenizer("deepseek")
    state = StructuredState(tok, DEEPSEEK_VOCAB_SIZE, [1])
    state.use_cache(cache)
    so = StructuredOutputsParams(json=SCHEMA)
    cache.wait(so)  # compiled before the requests arrive
    for rid in range(rows):
        state.add(rid, so, lambda: None)
        for t in tok.encode(PREFIX, add_special_tokens=False).ids:
            state.accept(rid, t)
    rids = list(range(rows))
    letter = tok.encode("c", add_special_tokens=False).ids[0]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sampler = Sampler(DEEPSEEK_VOCAB_SIZE)
    logits = torch.randn(rows, DEEPSEEK_VOCAB_SIZE, device=device)
    params, seeds = [SamplingParams(seed=1)] * rows, list(range(rows))
    pos = torch.arange(rows, dtype=torch.int32)
    mask = state.decode_mask(rids)
    assert mask is not None

    def update() -> None:  # one token forward and back per matcher (the state stays put)
        for g in state.grammars.values():
            g.accept(letter)
            g.matcher.rollback(1)

    out = {
        "mask_fill_ms": _ms(lambda: state.decode_mask(rids), sync, reps),
        "upload_ms": _ms(lambda: mask.to(device, non_blocking=True), sync, reps),
        "matcher_update_ms": _ms(update, sync, reps),
        "sample_ms": _ms(lambda: sampler.sample(logits, params, seeds, pos), sync, reps),
        "sample_masked_ms": _ms(lambda: sampler.sample(logits, params, seeds, pos, allowed=mask), sync, reps),
    }
    out["overhead_ms"] = (
        out["mask_fill_ms"]
        + out["upload_ms"]
        + out["matcher_update_ms"]
        + out["sample_masked_ms"]
        - out["sample_ms"]
    )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    device = torch.device(a.platform)
    tok = fixture_tokenizer("deepseek")
    cache = GrammarCache(vocabulary(tok, DEEPSEEK_VOCAB_SIZE, [1]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    result = {
        "platform": a.platform,
        "device": torch.cuda.get_device_name()
        if a.platform == "cuda"
        else host.processor() or host.machine(),
        "torch_threads": torch.get_num_threads(),
        "commit": commit.strip(),
        "vocab_size": DEEPSEEK_VOCAB_SIZE,
        "schema": SCHEMA,
        "rows": {str(r): measure(r, device, cache, a.reps) for r in a.rows},
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=2))


if __name__ == "__main__":
    main()
