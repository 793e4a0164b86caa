"""Greedy generation over the step runner: one batched prefill step, then one decode step per token.

This is the minimal loop behind `dsgraph generate`; the runtime issue replaces the Python bookkeeping
with the C++ scheduler (continuous batching, chunked prefill, sampling) behind the same command.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsgraph.runtime.step_runner import StepRunner


@dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS) or "length" (max_tokens or the model's length limit)


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int
    generated_tokens: int
    seconds: float

    def line(self) -> str:
        rate = self.generated_tokens / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"{self.generated_tokens} tokens generated for {self.prompt_tokens} prompt tokens "
            f"in {self.seconds:.2f} s ({rate:.1f} tokens/s)"
        )


def _check_prompts(prompts: Sequence[Sequence[int]], vocab: int, max_len: int) -> None:
    for i, ids in enumerate(prompts):
        if not ids:
            raise ValueError(f"prompts[{i}]: empty prompt")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompts[{i}]: token id {bad[0]} outside [0, {vocab})")
        if len(ids) >= max_len:
            raise ValueError(f"prompts[{i}]: {len(ids)} tokens, max_model_len is {max_len}")


def greedy_generate(
    runner: StepRunner, prompts: Sequence[Sequence[int]], max_tokens: int, eos_id: int | None
) -> tuple[list[Generation], GenerationStats]:
    """Generate up to `max_tokens` tokens per prompt, greedily, all prompts batched in every step."""
    geo, vocab = runner.model.geo, runner.model.cfg.text.vocab_size
    _check_prompts(prompts, vocab, geo.max_model_len)
    start = time.perf_counter()
    rids = list(range(len(prompts)))
    for rid in rids:
        runner.add(rid)
    out: dict[int, list[int]] = {rid: [] for rid in rids}
    reason: dict[int, str] = {}
    chunks = [(rid, list(prompts[rid])) for rid in rids]
    while chunks:
        logits = runner.step(chunks)
        nxt = []
        for (rid, _new), rows in zip(chunks, logits, strict=True):
            token = int(torch.argmax(rows[-1]))
            out[rid].append(token)
            length = len(prompts[rid]) + len(out[rid])
            if token == eos_id:
                reason[rid] = "stop"
            elif len(out[rid]) >= max_tokens or length >= geo.max_model_len:
                reason[rid] = "length"
            else:
                nxt.append((rid, [token]))
        chunks = nxt
    seconds = time.perf_counter() - start
    gens = [Generation(list(prompts[r]), out[r], reason[r]) for r in rids]
    stats = GenerationStats(sum(len(p) for p in prompts), sum(len(v) for v in out.values()), seconds)
    return gens, stats
