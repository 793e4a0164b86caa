"""Prompt log-probabilities and the `min_tokens` mask, both applied to a step's logits by the engine.

A request asking for prompt log-probabilities is admitted without a prefix-cache lookup
(`Scheduler.add_request(use_prefix_cache=False)`), so every prompt position is computed and has its
entry. Each entry holds the prompt token's log-probability, its rank in the model's distribution (1 =
most likely) and the k most likely tokens there (k = the request's `prompt_logprobs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsgraph.runtime._native import StepPlan

__all__ = ["PromptEntry", "mask_rows", "min_tokens_mask", "prompt_entries"]


@dataclass(frozen=True, slots=True)
class PromptEntry:
    """One prompt position: the prompt token's log-probability and rank, and the k most likely."""

    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def prompt_entries(logits: torch.Tensor, tokens: Sequence[int], ks: Sequence[int]) -> list[PromptEntry]:
    """Entries of rows predicting `tokens[i]` with `ks[i]` top tokens, from those rows' logits."""
    logprobs = torch.log_softmax(logits.double(), -1).cpu()
    ids = torch.tensor(list(tokens), dtype=torch.long)
    chosen = logprobs[torch.arange(len(ids)), ids]
    ranks = (logprobs > chosen[:, None]).sum(-1) + 1
    k_max = max(ks, default=0)
    top_lp, top_ids = torch.topk(logprobs, k_max, -1) if k_max else (None, None)
    out = []
    for i, k in enumerate(ks):
        top = () if not k else tuple(zip(top_ids[i, :k].tolist(), top_lp[i, :k].tolist(), strict=True))
        out.append(PromptEntry(float(chosen[i]), int(ranks[i]), top))
    return out


def min_tokens_mask(plan: StepPlan, live: Mapping[int, Any], eos_id: int) -> list[tuple[int, int]]:
    """(sample row, token id) pairs to mask: EOS and the stop token ids on every sample row whose request
    has fewer than `min_tokens` tokens before that row (`live`: request id -> record with `params` and
    `tokens`). Verify rows of one sequence (speculative decoding) follow one another."""
    hits: list[tuple[int, int]] = []
    starts, lengths = plan.verify_start.tolist(), plan.verify_len.tolist()
    for k, rid in enumerate(plan.seq_rids[: plan.num_seqs].tolist()):
        lv = live.get(rid)
        if lv is None or lv.params.min_tokens == 0:
            continue
        stops = (*lv.params.stop_token_ids, *(() if lv.params.ignore_eos else (eos_id,)))
        for j in range(lengths[k]):
            if len(lv.tokens) + j < lv.params.min_tokens:
                hits.extend((starts[k] + j, t) for t in stops)
    return hits


def mask_rows(logits: torch.Tensor, hits: Sequence[tuple[int, int]]) -> torch.Tensor:
    """`logits` with the (row, token id) entries of `hits` set to -inf (a copy; unchanged if none)."""
    if not hits:
        return logits
    logits = logits.clone()
    index = torch.tensor(list(hits), dtype=torch.long, device=logits.device)
    logits[index[:, 0], index[:, 1]] = float("-inf")
    return logits
