"""L2 equivalence check of prefill truncation: teacher-forced log-probabilities on a checkpoint (the tiny
random ones on CPU), mask against compact bit for bit, both against off within a stated bound, and the
DSpark confidences after the truncated prefill the same way.

One batch of requests of different lengths is prefilled in chunks (every step holds a chunk of each
unfinished prompt), then teacher-forced: each step feeds every request its next golden token, and the
log-softmax of every sampled row is kept. The steps are built by `runtime/step_runner.py` and truncated
by the engine's `runtime/prefill_truncation.py`. The drafter then drafts once per request from its first
golden token (anchor at the prompt's end), reading the context rings the prefill wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsgraph.models.deepseek_v41.config import ModelConfig, load_config
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import numerics_for
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.models.deepseek_v41.weights import prepare_weights
from dsgraph.runtime.prefill_truncation import resolve_keep, truncated_inputs
from dsgraph.runtime.spec_draft import DraftRunner
from dsgraph.runtime.step_runner import StepRunner

__all__ = ["L2Config", "L2Result", "compare_l2", "run_mode"]


@dataclass(frozen=True)
class L2Config:
    prompt_lens: tuple[int, ...] = (45, 23, 60)
    golden_len: int = 4
    chunk: int = 24
    keep: int | None = None  # None: the model's minimum (sliding_window + maximum backtrack)
    numerics: str = "serving"
    seed: int = 5
    max_model_len: int = 256
    page_size: int = 16


@dataclass
class L2Result:
    logprobs: list[torch.Tensor] = field(default_factory=list)  # per request [golden_len, V]
    golden: list[list[int]] = field(default_factory=list)
    confidence: torch.Tensor | None = None  # [requests, K] after the prefill
    truncated_steps: int = 0


def _tokens(seed: int, n: int, vocab: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab - 1, (n,), generator=gen).tolist()


def _runner(model_dir: Path, cfg: ModelConfig, mode: str, c: L2Config) -> tuple[StepRunner, Any]:
    num = numerics_for(c.numerics)
    token_map, _ = build_token_map(load_tokenizer(model_dir, cfg.text.vocab_size))
    geo = default_geometry(cfg.text, c.max_model_len, c.page_size)
    dspark = cfg.text.num_nextn_predict_layers > 0
    model = build_model(cfg, token_map, num, geo, dspark=dspark, truncation=mode)
    from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint

    weights = prepare_weights(cfg, load_checkpoint(model_dir, cfg, progress=False), num, token_map)
    pages = len(c.prompt_lens) * geo.pages_per_seq(1)
    return StepRunner(model, weights, num_slots=len(c.prompt_lens), num_pages=pages), weights


def _run_step(
    runner: StepRunner, chunks: Sequence[tuple[int, Sequence[int]]], sample: Sequence[int], keep_start: Any
) -> tuple[torch.Tensor, bool]:
    """One step over (request, tokens) chunks sampling the rows `sample`; returns (logits, truncated)."""
    inputs = {k: v.numpy() for k, v in runner.step_inputs(chunks).items()}
    inputs["sample_rows"] = np.asarray(sample, dtype=np.int32)
    mode = runner.model.truncation
    window = runner.model.cfg.text.sliding_window
    cut = None if mode == "off" else truncated_inputs(inputs, keep_start, mode, window)
    logits = runner.session.run(inputs if cut is None else cut)
    for rid, new in chunks:
        runner.requests[rid].tokens += list(new)
    return logits, cut is not None


def run_mode(model_dir: Path, mode: str, c: L2Config = L2Config()) -> L2Result:
    cfg = load_config(model_dir)
    runner, weights = _runner(model_dir, cfg, mode, c)
    vocab = cfg.text.vocab_size
    keep = resolve_keep(cfg.text, c.keep)
    prompts = [_tokens(c.seed + i, n, vocab) for i, n in enumerate(c.prompt_lens)]
    out = L2Result(golden=[_tokens(c.seed + 100 + i, c.golden_len, vocab) for i in range(len(prompts))])
    for rid in range(len(prompts)):
        runner.add(rid)
    keep_start = np.array([max(len(p) - keep, 0) for p in prompts], dtype=np.int32)
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts, strict=True)):
        live = [r for r, p in enumerate(prompts) if done[r] < len(p)]
        chunks = [(r, prompts[r][done[r] : done[r] + c.chunk]) for r in live]
        ends = np.cumsum([len(t) for _, t in chunks]) - 1
        finishing = [k for k, (r, t) in enumerate(chunks) if done[r] + len(t) == len(prompts[r])]
        logits, cut = _run_step(runner, chunks, [int(ends[k]) for k in finishing], keep_start[live])
        out.truncated_steps += cut
        for j, k in enumerate(finishing):
            rows[chunks[k][0]].append(torch.log_softmax(logits[j].float(), -1))
        for r, t in chunks:
            done[r] += len(t)
    out.confidence = _confidences(runner, weights, prompts, out.golden) if runner.model.dspark else None
    for i in range(c.golden_len - 1):
        chunks = [(r, [out.golden[r][i]]) for r in range(len(prompts))]
        logits, _ = _run_step(runner, chunks, list(range(len(prompts))), np.zeros(len(prompts), np.int32))
        for r in range(len(prompts)):
            rows[r].append(torch.log_softmax(logits[r].float(), -1))
    out.logprobs = [torch.stack(r) for r in rows]
    return out


def _confidences(runner: StepRunner, weights: Mapping[str, torch.Tensor], prompts, golden) -> torch.Tensor:
    drafter = DraftRunner(runner.session, weights)
    requests = [
        DraftRequest(anchor=golden[r][0], position=len(p), slot=runner.requests[r].slot)
        for r, p in enumerate(prompts)
    ]
    return drafter.run(requests).confidence


def _golden_lp(res: L2Result) -> torch.Tensor:
    """[requests, golden_len] the log-probability of each golden token."""
    return torch.stack(
        [lp[torch.arange(len(g)), torch.tensor(g)] for lp, g in zip(res.logprobs, res.golden, strict=True)]
    )


def compare_l2(results: Mapping[str, L2Result]) -> dict[str, Any]:
    """The L2 figures: mask == compact bit for bit (log-probs and confidences), and each against off."""
    off, mask, compact = results["off"], results["mask"], results["compact"]
    same = all(torch.equal(a, b) for a, b in zip(mask.logprobs, compact.logprobs, strict=True))
    conf_same = mask.confidence is None or torch.equal(mask.confidence, compact.confidence)
    gold = {m: _golden_lp(r) for m, r in results.items()}
    out: dict[str, Any] = {
        "mask_equals_compact": bool(same),
        "confidence_mask_equals_compact": bool(conf_same),
        "truncated_steps": compact.truncated_steps,
        "max_golden_logprob_diff_vs_off": float((gold["compact"] - gold["off"]).abs().max()),
        "max_logprob_diff_vs_off": max(
            float((a - b).abs().max()) for a, b in zip(compact.logprobs, off.logprobs, strict=True)
        ),
    }
    if off.confidence is not None:
        out["max_confidence_diff_vs_off"] = float((compact.confidence - off.confidence).abs().max())
    return out
