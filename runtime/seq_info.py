"""What the model runner needs of one request of a step (`SeqInfo`), the placeholder of a request
released while still in the step's plan, and teacher forcing (the one place golden tokens replace
samples, for plain and speculative steps alike)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dsgraph.runtime.sampling_params import SamplingParams

__all__ = ["RELEASED", "SeqInfo", "force_rows"]


@dataclass(frozen=True)
class SeqInfo:
    """One request of a step as the runner sees it."""

    rid: int
    params: SamplingParams
    seed: int
    forced: int | None  # a golden (teacher-forced) token to emit instead of its sample
    continues: Callable[[list[int]], bool]  # whether the request goes on after emitting these tokens


# A request released while in the step's plan: its rows run, their samples are discarded.
RELEASED = SeqInfo(-1, SamplingParams(temperature=0.0), 0, None, lambda _: False)


def force_rows(
    logits: torch.Tensor,
    rows: Sequence[int],
    ids: Sequence[int],
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
) -> None:
    """Teacher forcing, in place: sample row rows[i] emits ids[i] instead of its sample (before the
    scheduler sees it, so stop conditions and caches follow the forced token). Its logprob is that
    token's under the model's raw distribution; the top list stays the sampler's. `tokens` and
    `logprobs` are on the host."""
    if not rows:
        return
    at = torch.tensor(list(rows), dtype=torch.long)
    want = torch.tensor(list(ids), dtype=torch.long)
    tokens[at] = want.to(tokens.dtype)
    lp = torch.log_softmax(logits[at.to(logits.device)].float(), -1).cpu()
    logprobs[at] = lp[torch.arange(len(rows)), want].to(logprobs.dtype)
