"""The host gap between target steps with DSpark drafting on, with and without zero-overhead scheduling
(runtime/spec_overlap.py), on a random tiny checkpoint: the time from the moment step N's results are
on the host to the submission of step N+1 (`ModelRunner.gaps`), per step, plus the engine's wall time
per step. Without overlap the gap holds verification, the draft pass, the scheduler's commit and plan,
and the detokenization and events of step N; with overlap the last of these run while step N+1 does.
Both runs must emit the same tokens (`identical`).

`python -m dsgraph.tools.bench.overlap_gap --platform cpu` prints the cpu figure; `dsgraph bench
--parts overlap` adds the cuda figure to the bench JSON."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCHES = (1, 4)
MAX_TOKENS = 16


def _prompts(batch: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(batch)
    return [rng.integers(3, vocab, 5 + i % 7).tolist() for i in range(batch)]


def _run(model_dir: Path, platform: str, batch: int, overlap: str) -> tuple[dict[str, Any], list[Any]]:
    from dsgraph.runtime.llm import LLM
    from dsgraph.runtime.sampling_params import SamplingParams

    llm = LLM(
        model_dir,
        platform=platform,
        speculative="dspark",
        verify_schedule="fixed",
        draft_pause=False,
        overlap=overlap,
        max_model_len=128,
        max_num_seqs=batch,
        enable_prefix_cache=False,
    )
    prompts = _prompts(batch, llm.engine.cfg.text.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.generate(prompts, params)  # lowering and capture happen here
    runner = llm.engine.runner
    runner.gaps.clear()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall_ms = (time.perf_counter() - start) * 1e3
    gaps = np.asarray(runner.gaps)
    row = {
        "batch": batch,
        "overlap": overlap,
        "steps": len(gaps) + 1,
        "host_gap_ms_mean": float(gaps.mean()) if len(gaps) else None,
        "host_gap_ms_median": float(np.median(gaps)) if len(gaps) else None,
        "host_gap_ms_p90": float(np.percentile(gaps, 90)) if len(gaps) else None,
        "wall_ms_per_step": wall_ms / (len(gaps) + 1),
    }
    return row, [o.outputs[0].token_ids for o in outs]


def host_gap_cases(
    model_dir: Path, platform: str, batches: tuple[int, ...] = BATCHES
) -> list[dict[str, Any]]:
    rows = []
    for batch in batches:
        off, off_tokens = _run(model_dir, platform, batch, "off")
        on, on_tokens = _run(model_dir, platform, batch, "on")
        same = off_tokens == on_tokens
        rows += [{**off, "identical": same}, {**on, "identical": same}]
    return rows


def tiny_checkpoint(root: str) -> Path:
    """A random tiny V4.1 checkpoint with DSpark stages (the host gap hardly depends on the model)."""
    from dsgraph.models.deepseek_v41.tiny import make_tiny

    return make_tiny(Path(root) / "tiny", seed=7)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--platform", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--model", help="checkpoint directory (default: a random tiny one)")
    p.add_argument("--out", help="also write the rows to this JSON file")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else tiny_checkpoint(tmp)
        rows = host_gap_cases(model, args.platform)
    text = json.dumps(rows, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
