"""Helpers of the cpu rules for the step layout (dsgraph.ops.cache): row -> sequence lookups, range
checks whose errors name the row, sequence and entry, and a batch-invariant row-wise projection."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["locate_entries", "per_row", "real_rows", "require_in_range", "require_unique", "rowwise_linear"]


def real_rows(op: str, seq_ids: Tensor, num_seqs: int) -> tuple[Tensor, Tensor]:
    """(is_real [T] bool, seq [T] int64 with padding rows mapped to sequence 0, safe to index with)."""
    bad = (seq_ids < -1) | (seq_ids >= num_seqs)
    if bool(bad.any()):
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
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise IndexError(f"{op}: {what}[{i}] is {int(values[i])}, expected 0..{upper - 1}")


def require_unique(op: str, keys: Tensor, rows: Tensor, what: str) -> None:
    """`keys` (one int64 per written row, `rows` their row ids) must be distinct: one write per cache row."""
    if keys.numel() < 2:
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
    if bool(bad.any()):
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
