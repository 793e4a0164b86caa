"""What a request returns, in vLLM's shape: one `RequestOutput` per request holding one `CompletionOutput`
per sampled sequence (`n`), log-probabilities as one `{token id: Logprob}` dict per position.

Log-probabilities of generated tokens are those of the processed distribution (after temperature, top-k,
top-p and min-p), as the `sample` op reports them (DeepInfer's convention; vLLM's default reports the raw
model distribution); a token cut from that distribution has -inf (a JSON API clamps it, as DeepInfer
does at -9999). Prompt log-probabilities are the raw model distribution's (nothing is sampled there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "FINISH_REASONS",
    "CompletionOutput",
    "FinishReason",
    "Logprob",
    "PositionLogprobs",
    "RequestOutput",
]

# "stop": EOS, a stop token id or a stop string; "length": max_tokens or max_model_len; "abort": aborted
# by the caller or the engine (preempted and dropped, failed structured output).
FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")


@dataclass(frozen=True, slots=True)
class Logprob:
    """One token's log-probability at one position. `rank`: 1 for the most likely token; None where it
    is not known (a sampled token outside the 20 most likely)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: the chosen (or prompt) token and the k most likely, most likely first.
PositionLogprobs = dict[int, Logprob]


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One generated sequence. `logprobs` is None unless the request asked for them (then one dict per
    token of `token_ids`); `cumulative_logprob` is their sum (None likewise). `stop_reason` is the stop
    string or stop token id that ended it (None for EOS, length, abort or unfinished)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    # Speculative decoding: drafts verified for this sequence and how many of them were accepted (each
    # accepted draft is an extra token emitted by one target step); 0 with drafting off.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def __post_init__(self) -> None:
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason: {self.finish_reason!r} must be one of {list(FINISH_REASONS)}")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"logprobs: {len(self.logprobs)} entries, expected one per token ({len(self.token_ids)})"
            )

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A request's state: its prompt and its completions so far (final when `finished`).

    `prompt_logprobs` has one entry per prompt token: None for the first (nothing precedes it), then
    the prompt token's and the k most likely tokens' log-probabilities given the tokens before it; the
    field is None unless asked for.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: tuple[CompletionOutput, ...]
    # A rejected request: the message names the bad field and `outputs` is empty. A request that failed
    # inside the engine: the message says why and `outputs` holds what it produced before.
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (not recomputed)

    def __post_init__(self) -> None:
        if self.prompt_logprobs is not None and len(self.prompt_logprobs) != len(self.prompt_token_ids):
            raise ValueError(
                f"prompt_logprobs: {len(self.prompt_logprobs)} entries, expected one per prompt token "
                f"({len(self.prompt_token_ids)})"
            )

    @property
    def finished(self) -> bool:
        return self.error is not None or (bool(self.outputs) and all(o.finished for o in self.outputs))
