"""What a request returns (DeepInfer's `RequestOutput`, deepinfer-parity 1.8, in the shape the OpenAI-style
APIs need): one `RequestOutput` per request holding one `CompletionOutput` per sampled sequence (`n`).

Log-probabilities are those of the processed distribution (after temperature, top-k, top-p, min-p and
the structured-output mask), as the `sample` op reports them; a token cut from that distribution has
-inf (a JSON API clamps it, as DeepInfer does at -9999).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FINISH_REASONS", "CompletionOutput", "FinishReason", "RequestOutput", "TopLogprobs"]

# "stop": EOS, a stop token id or a stop string; "length": max_tokens or max_model_len; "abort": aborted
# by the caller or the engine (preempted and dropped, failed structured output).
FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")

# Per generated token, the k most likely (token id, logprob) pairs, most likely first.
TopLogprobs = tuple[tuple[tuple[int, float], ...], ...]


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One generated sequence. `logprobs`/`top_logprobs` are None unless the request asked for them;
    otherwise they hold one entry per token of `token_ids`. `stop_reason` is the stop string or stop
    token id that ended it (None for EOS, length, abort or unfinished)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: TopLogprobs | None = None
    stop_reason: str | int | None = None
    # Speculative decoding: drafts verified for this sequence and how many of them were accepted (each
    # accepted draft is an extra token emitted by one target step); 0 with drafting off.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def __post_init__(self) -> None:
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason: {self.finish_reason!r} must be one of {list(FINISH_REASONS)}")
        for name in ("logprobs", "top_logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.token_ids):
                raise ValueError(
                    f"{name}: {len(values)} entries, expected one per token ({len(self.token_ids)})"
                )

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A request's state: its prompt and its completions so far (final when `finished`).

    `prompt_logprobs` has one entry per prompt token: None for the first (nothing precedes it), then
    the log-probability of each token given the tokens before it; the field is None unless asked for.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    prompt_logprobs: tuple[float | None, ...] | None = None
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
