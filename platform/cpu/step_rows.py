"""Helpers of the cpu rules for the step layout (dsgraph.ops.cache): row -> sequence lookups, range
checks whose errors name the row, sequence and entry, and a batch-invariant row-wise projection.

The checks read values on the host. `unchecked()` switches them off while a CUDA graph is captured
(a host read cannot be captured); the eager warm-up before a capture runs them on its inputs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

__all__ = [
    "checking",
    "unchecked",
    "locate_entries",
    "per_row",
    "real_rows",
    "require_in_range",
    "require_unique",
    "rowwise_linear",
    "scatter_rows",
]

_CHECKING: ContextVar[bool] = ContextVar("dsgraph_rule_checks", default=True)


def checking() -> bool:
    """Whether rules run their host-side value checks (True except inside `unchecked()`)."""
    return _CHECKING.get()


@contextmanager
def unchecked() -> Iterator[None]:
    """Rules skip their value checks (no host reads) inside this block; results are unchanged."""
    token = _CHECKING.set(False)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def real_rows(op: str, seq_ids: Tensor, num_seqs: int) -> tuple[Tensor, Tensor]:
    """(is_real [T] bool, seq [T] int64 with padding rows mapped to sequence 0, safe to index with)."""
    bad = ((seq_ids < -1) | (seq_ids >= num_seqs)) if checking() else None
    if bad is not None and bool(bad.any()):
        t = int(bad.nonzero()[0, 0])
        raise IndexError(
            f"{op}: row {t} has seq_id {int(seq_ids[t])}, expected -1 (padding) or 0..{num_seqs - 1}"
        )
    return seq_ids >= 0, seq_ids.clamp_min(0).long()


def per_row(values: Tensor, seq: Tensor, real: Tensor) -> Tensor:
    """int64 `values[seq]` of a per-sequence vector for real rows, 0 for padding rows (whose sequence, and
    the values of sequences that own no row, may be anything; a step may even have no sequences)."""
    if values.numel() == 0:
        return torch.zeros_like(seq)
    return torch.where(real, values.long()[seq], 0)


def require_in_range(op: str, values: Tensor, upper: int, what: str, active: Tensor | None = None) -> None:
    """Every (active) element of a per-sequence or per-row vector is in [0, upper); else name the index."""
    bad = (values < 0) | (values >= upper)
    if active is not None:
        bad &= active
    if checking() and bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise IndexError(f"{op}: {what}[{i}] is {int(values[i])}, expected 0..{upper - 1}")


def require_unique(op: str, keys: Tensor, rows: Tensor, what: str) -> None:
    """`keys` (one int64 per written row, `rows` their row ids) must be distinct: one write per cache row."""
    if keys.numel() < 2 or not checking():
        return
    order = torch.sort(keys, stable=True).indices
    sorted_keys = keys[order]
    dup = (sorted_keys[1:] == sorted_keys[:-1]).nonzero()
    if dup.numel():
        i = int(dup[0, 0])
        first, second = int(rows[order[i]]), int(rows[order[i + 1]])
        raise ValueError(
            f"{op}: rows {first} and {second} both write {what}; one step writes a cache row once"
        )


def locate_entries(
    op: str, block_table: Tensor, seq: Tensor, entry: Tensor, row: Tensor, block_size: int, num_blocks: int
) -> Tensor:
    """Physical block of compressed entry `entry` of sequence `seq` (flat int64 vectors; `row` for messages).

    An entry below 0, past the table (g // bs >= nb), in an unallocated block (-1) or in a block id past
    the pool is an error naming the row, the sequence and the entry.
    """
    table_width = block_table.shape[1]
    column = torch.div(entry, block_size, rounding_mode="floor")
    inside = (entry >= 0) & (column < table_width)
    block = torch.where(inside, block_table[seq, column.clamp(0, max(table_width - 1, 0))].long(), -1)
    bad = (block < 0) | (block >= num_blocks)
    if checking() and bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        g, s = int(entry[i]), int(seq[i])
        why = (
            f"past the block table ({table_width} blocks of {block_size})"
            if g < 0 or not bool(inside[i])
            else f"in block {int(block[i])}, which is unallocated or past the pool of {num_blocks} blocks"
        )
        raise IndexError(f"{op}: row {int(row[i])} (sequence {s}) needs entry {g}, {why}")
    return block


def rowwise_linear(x: Tensor, w: Tensor) -> Tensor:
    """`x [*, k] . w[n, k]^T` in f32, one row at a time (a batched matmul with M = 1).

    A plain GEMM's rounding depends on how many rows it multiplies; computing each row on its own makes
    a chunk's results identical however the rows of a sequence are split into steps.
    """
    xf, wf = x.float(), w.float()
    lead = xf.shape[:-1]
    rows = xf.reshape(-1, 1, xf.shape[-1])
    out = torch.bmm(rows, wf.t().unsqueeze(0).expand(rows.shape[0], -1, -1))
    return out.reshape(*lead, wf.shape[0])


def scatter_rows(flat: Tensor, target: Tensor, values: Tensor, write: Tensor) -> None:
    """`flat[target[t]] = values[t]` for the rows with `write[t]`, in place, with fixed shapes and no host
    read (the form a CUDA graph can hold; the rules use it when unchecked). Rows that write nothing are
    pointed at the first writing row's target with that row's value, or with no writer at all at row 0
    with its current value: every duplicate index then carries the same bytes, so the scatter is
    deterministic. Targets of writing rows must be distinct and in range (the checked path verifies it)."""
    if target.shape[0] == 0:
        return
    first = write.int().argmax().view(1)  # the first writing row, or row 0
    any_write = write.any()
    fallback_target = torch.where(any_write, target.index_select(0, first), 0)
    fallback_value = torch.where(any_write, values.index_select(0, first), flat[:1])
    shape = (-1,) + (1,) * (values.dim() - 1)
    rows = torch.where(write, target, fallback_target)
    flat.index_copy_(0, rows, torch.where(write.view(shape), values, fallback_value))
