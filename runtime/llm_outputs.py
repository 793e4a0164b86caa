"""Engine request records -> vLLM-shaped `RequestOutput`s (runtime/outputs.py) for the offline API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from dsgraph.runtime.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from dsgraph.runtime.sampling_params import SamplingParams

__all__ = ["request_output"]


def _position(
    tok: Tokenizer, chosen: int, logprob: float, rank: int | None, top: Sequence[tuple[int, float]]
) -> PositionLogprobs:
    """The chosen token's entry, then the most likely tokens' (rank = place in the top list)."""
    out = {chosen: Logprob(logprob, rank, tok.decode([chosen], skip_special_tokens=False))}
    for j, (tid, lp) in enumerate(top):
        if tid not in out:
            out[tid] = Logprob(lp, j + 1, tok.decode([tid], skip_special_tokens=False))
    return out


def _completion(k: int, live: Any, params: SamplingParams, tok: Tokenizer) -> CompletionOutput:
    logprobs = cumulative = None
    if params.logprobs is not None:
        logprobs = []
        for token, lp, top in zip(live.tokens, live.logprobs, live.top, strict=True):
            ids = [t for t, _ in top]
            rank = ids.index(token) + 1 if token in ids else None
            logprobs.append(_position(tok, token, lp, rank, top))
        cumulative = float(sum(live.logprobs))
    return CompletionOutput(
        index=k,
        text=live.text,
        token_ids=tuple(live.tokens),
        cumulative_logprob=cumulative,
        logprobs=logprobs,
        finish_reason=live.finish,
        stop_reason=live.stop_reason,
        num_draft_tokens=live.num_draft_tokens,
        num_accepted_tokens=live.num_accepted_tokens,
    )


def request_output(
    request_id: str,
    prompt: str | None,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    lives: Sequence[Any],
    error: str | None,
    tok: Tokenizer,
) -> RequestOutput:
    """The state of one request (`lives`: the engine records of its n completions)."""
    if error is not None or not lives:
        return RequestOutput(request_id, prompt, tuple(prompt_ids), None, (), error=error)
    comps = tuple(_completion(k, live, params, tok) for k, live in enumerate(lives))
    first = lives[0]
    prompt_lp: list[PositionLogprobs | None] | None = None
    if params.prompt_logprobs is not None:
        prompt_lp = [None]
        for pos in range(1, len(prompt_ids)):
            e = first.prompt_logprobs.get(pos)
            prompt_lp.append(None if e is None else _position(tok, prompt_ids[pos], e.logprob, e.rank, e.top))
    failed = next((live.error for live in lives if live.error), None)
    return RequestOutput(
        request_id, prompt, tuple(prompt_ids), prompt_lp, comps, failed, first.num_cached_tokens or 0
    )
