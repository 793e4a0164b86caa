"""Padding a step to a CUDA-graph bucket: the C++ scheduler pads token rows to its bucket table; a
captured step also needs fixed sequence and output counts, so the session pads every step dim here.

Padding rows have seq_id -1: no op reads or writes anything for them (`platform/cpu/step_rows.real_rows`).
A padding sequence owns no row, so its slot, chunk bounds, lookback and block table are never read; they
hold slot 0, zeros, -1 (no token) and -1 (no page). A padding output samples row 0 and is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

PAD_VALUES: dict[str, int] = {"seq_ids": -1, "kept_seq_ids": -1, "lookback": -1}
PAD_PREFIXES: dict[str, int] = {"block_table_r": -1}


def bucket_size(n: int) -> int:
    """The padded size of a dim of `n` for CUDA-graph buckets: the next power of two (at least 1)."""
    return 1 << max(n - 1, 0).bit_length()


def pad_value(name: str) -> int:
    if name in PAD_VALUES:
        return PAD_VALUES[name]
    return next((v for prefix, v in PAD_PREFIXES.items() if name.startswith(prefix)), 0)


def pad_step(
    step: Mapping[str, np.ndarray], dims: Mapping[str, str], sizes: Mapping[str, int]
) -> dict[str, np.ndarray]:
    """`step`'s inputs padded along their first axis to `sizes[dims[name]]` (dims: input -> its first
    axis's symbolic dim, e.g. "tokens", "seqs", "outs") with the padding values above; ValueError names
    an input longer than its bucket."""
    out: dict[str, np.ndarray] = {}
    for name, value in step.items():
        arr = np.asarray(value)
        target = sizes[dims[name]]
        if arr.shape[0] > target:
            raise ValueError(
                f"step input {name}: {arr.shape[0]} {dims[name]}, more than the bucket's {target}"
            )
        if arr.shape[0] == target:
            out[name] = arr
            continue
        padded = np.full((target, *arr.shape[1:]), pad_value(name), dtype=arr.dtype)
        padded[: arr.shape[0]] = arr
        out[name] = padded
    return out
