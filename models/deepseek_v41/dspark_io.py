"""Graph inputs of one DSpark drafting pass, and the host-side builder of their values.

Symbolic dims: `seqs` (sequences drafted, the draft bucket) and `tokens` = block_size * seqs (their block
rows; rows of sequence s are s*K .. s*K + K-1, K = dspark_block_size). Sequence s drafts from anchor
token t_a at position a (the newest token, sampled but not yet run through the target): its rows hold
[t_a, NOISE x (K-1)] at positions a .. a+K-1 and it reads context keys a-window .. a-1 of ring slot
`seq_slot[s]`. A padding sequence has seq_ids -1 on its rows; its outputs are meaningless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsgraph.graph.types import TensorType
from dsgraph.models.deepseek_v41.config import TextConfig

__all__ = ["DraftRequest", "draft_inputs", "draft_types", "request_columns"]


def draft_types(text: TextConfig) -> dict[str, TensorType]:
    """Step inputs of the draft graph (`step.*`)."""
    i32, f32, k = "i32", "f32", text.dspark_block_size
    return {
        "token_ids": TensorType(("tokens",), i32),  # [t_a, NOISE x (K-1)] per sequence
        "positions": TensorType(("tokens",), i32),  # a .. a+K-1
        "seq_ids": TensorType(("tokens",), i32),  # row -> sequence, -1 for padding
        "block_rows": TensorType(("seqs", k), i32),  # the K rows of each sequence
        "seq_slot": TensorType(("seqs",), i32),  # state slot: which dspark.ring{s} row to read
        "seq_start": TensorType(("seqs",), i32),  # the anchor position a
        "seq_window_start": TensorType(("seqs",), i32),  # first position whose context key it holds
        # per-request sampling parameters of the `sample` op (temperature < 1e-5 drafts greedily)
        "temperature": TensorType(("seqs",), f32),
        "top_p": TensorType(("seqs",), f32),
        "top_k": TensorType(("seqs",), i32),
        "min_p": TensorType(("seqs",), f32),
        "seed": TensorType(("seqs",), "i64"),
    }


@dataclass(frozen=True, slots=True)
class DraftRequest:
    """One sequence to draft for: its anchor token and position, state slot and sampling parameters."""

    anchor: int
    position: int
    slot: int
    window_start: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0


def draft_inputs(
    text: TextConfig, requests: Sequence[DraftRequest], num_seqs: int | None = None
) -> dict[str, torch.Tensor]:
    """Values of `draft_types` for `requests`, padded with padding sequences to `num_seqs` (a bucket)."""
    k, noise = text.dspark_block_size, text.dspark_noise_token_id
    seqs = len(requests) if num_seqs is None else num_seqs
    if seqs < max(len(requests), 1):
        raise ValueError(f"draft_inputs: num_seqs is {seqs}, expected >= max(1, {len(requests)} requests)")
    pad = DraftRequest(anchor=noise, position=0, slot=0)
    rows = [*requests, *([pad] * (seqs - len(requests)))]
    cols = {
        "token_ids": [t for r in rows for t in [r.anchor] + [noise] * (k - 1)],
        "positions": [r.position + j for r in rows for j in range(k)],
        "seq_ids": [s if s < len(requests) else -1 for s in range(seqs) for _ in range(k)],
        "block_rows": [[s * k + j for j in range(k)] for s in range(seqs)],
        "seq_slot": [r.slot for r in rows],
        "seq_start": [r.position for r in rows],
        "seq_window_start": [r.window_start for r in rows],
        "top_k": [r.top_k for r in rows],
    }
    return request_columns(cols, rows)


def request_columns(cols: dict[str, list[Any]], rows: Sequence[DraftRequest]) -> dict[str, torch.Tensor]:
    """The i32 columns `cols` as tensors, plus the float and seed sampling parameters of `rows`."""
    out = {name: torch.tensor(v, dtype=torch.int32) for name, v in cols.items()}
    for name in ("temperature", "top_p", "min_p"):
        out[name] = torch.tensor([getattr(r, name) for r in rows], dtype=torch.float32)
    out["seed"] = torch.tensor([r.seed for r in rows], dtype=torch.int64)
    return out
