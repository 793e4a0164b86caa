"""CUDA rule of the `sample` op for its "greedy_token" processing (ops/sampling.py): the greedy passes of
the target's sampler and of the drafter take one token per row by an argmax and read no log-probability.
The cpu rule spends ten torch launches on it (the dead-row test, the argmax, the NaN and -1 fills);
sampling_tl.py's two kernels give the same bits (the argmax is exact: a comparison, no arithmetic).
Every other processing runs the cpu rule on device tensors (the f64 sorts of the full distribution).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_sampling
from dsgraph.platform.cuda.kernels.attention import runs_kernels

__all__ = ["CHUNK", "KERNELS", "RULES", "sample"]

CHUNK = 4096  # logits per program of the split pass (16 KiB of f32)


def sample(
    p: Any, logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, min_p: Tensor,
    seed: Tensor, position: Tensor, *allowed: Tensor, chunk: int = CHUNK,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    if p.processing != "greedy_token" or not runs_kernels(logits):
        return rules_sampling.sample(p, logits, temperature, top_p, top_k, min_p, seed, position, *allowed)
    from dsgraph.platform.cuda.kernels.sampling_tl import launch_greedy_token

    rows, vocab = logits.shape
    new = logits.new_empty
    outs = (
        new((rows,), dtype=torch.int32),
        new((rows,)),
        new((rows, p.num_top_logprobs)),
        new((rows, p.num_top_logprobs), dtype=torch.int32),
    )
    if rows:
        splits = -(-vocab // chunk)
        parts = (new((rows * splits,)), *(new((rows * splits,), dtype=torch.int32) for _ in range(3)))
        mask = allowed[0].contiguous() if allowed else None
        launch_greedy_token(logits.contiguous(), mask, parts, outs, chunk)
    return outs


RULES: dict[str, Any] = {"sample": sample}
KERNELS: dict[str, tuple[str, ...]] = {
    "sample": ("sampling_tl.argmax_split_kernel", "sampling_tl.argmax_merge_kernel")
}
