"""Reference meaning of window_compress (dsgraph.ops.window_compress), in torch.

Only the closing rows pool (one row in `ratio`), so a long chunk costs span * W values per entry, not per
row. Projections are computed row by row, so results do not depend on how a sequence is split into steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.ops.window_compress import window_span
from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.rules_cache import _used_seqs, _write_ring
from dsgraph.platform.cpu.step_rows import checking, per_row, real_rows, require_in_range, rowwise_linear


def _window_projections(
    kv: Tensor, gate: Tensor, state: Tensor, rows: Tensor, positions: Tensor, start: Tensor, slot: Tensor,
    seq: Tensor, span: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(kv, gate, pos) [n, span, W] of the `span` positions ending at each closing row, oldest first:
    from the chunk's rows when at or after seq_start, else from the slot's state ring."""
    back = torch.arange(span - 1, -1, -1, device=positions.device)
    pos = positions.long()[rows].unsqueeze(1) - back  # [n, span]
    src = rows.unsqueeze(1) - back
    in_chunk = pos >= start[rows].unsqueeze(1)
    safe = src.clamp(0, max(kv.shape[0] - 1, 0))
    wrong = in_chunk & ((positions.long()[safe] != pos) | (seq[safe] != seq[rows].unsqueeze(1)))
    if checking() and bool(wrong.any()):
        i, j = (int(v) for v in wrong.nonzero()[0])
        raise ValueError(
            f"window_compress: row {int(rows[i])} needs position {int(pos[i, j])} of its chunk at row "
            f"{int(src[i, j])}, which holds another position or sequence; rows must be contiguous"
        )
    ring = state[slot[rows].unsqueeze(1), torch.remainder(pos, state.shape[1])]  # [n, span, 2, W]
    use = in_chunk.unsqueeze(-1)
    return torch.where(use, kv[safe], ring[:, :, 0]), torch.where(use, gate[safe], ring[:, :, 1]), pos


def _pool(p: Any, kv: Tensor, gate: Tensor, pos: Tensor, ape: Tensor) -> Tensor:
    """Softmax-over-tokens pooling per channel of the windows gathered by `_window_projections`."""
    z = gate + ape.float()[torch.remainder(pos, p.ratio)]
    if p.overlap:  # previous window: first series; this window: second series
        half = kv.shape[-1] // 2
        kv = torch.cat((kv[:, : p.ratio, :half], kv[:, p.ratio :, half:]), dim=1)
        z = torch.cat((z[:, : p.ratio, :half], z[:, p.ratio :, half:]), dim=1)
    z = torch.where((pos >= 0).unsqueeze(-1), z, float("-inf"))  # window -1 does not exist
    return (kv * invariant.softmax(z, 1)).sum(dim=1)


def _closing_rows(closes: Tensor, ratio: int, num_seqs: int) -> Tensor:
    """Indices of the closing rows. Unchecked (capturable): a fixed count, T // ratio + seqs (a sequence of
    L rows closes at most L // ratio + 1 windows), padded with T."""
    if checking():
        return closes.nonzero().squeeze(1)
    rows = closes.shape[0]
    count = min(rows, rows // ratio + num_seqs)
    return torch.nonzero_static(closes, size=count, fill_value=rows).squeeze(1)


def window_compress(p: Any, *operands: Tensor) -> tuple[Tensor, ...]:
    return window_compress_into(p, *operands[:4], operands[4].clone(), *operands[5:])


def window_compress_into(
    p: Any, u: Tensor, wkv: Tensor, wgate: Tensor, ape: Tensor, state: Tensor, *step: Tensor
) -> tuple[Tensor, ...]:
    return pool_windows(p, rowwise_linear(u, wkv), rowwise_linear(u, wgate), ape, state, *step)


def pool_windows(
    p: Any, kv: Tensor, gate: Tensor, ape: Tensor, state: Tensor, positions: Tensor, seq_ids: Tensor,
    seq_slot: Tensor, seq_start: Tensor,
) -> tuple[Tensor, ...]:  # fmt: skip
    """window_compress after its projections kv, gate [T, W] f32 (the cuda rule projects with its linear
    kernel): the closing rows' pooled entries, then the state ring's writes (in place). Unchecked, the
    closing rows are a fixed count (`_closing_rows`, padded with T) and nothing reads the host: the form a
    CUDA graph captures."""
    real, seq = real_rows("window_compress", seq_ids, seq_slot.shape[0])
    if checking():
        used = _used_seqs(seq, real, seq_slot.shape[0])
        require_in_range("window_compress", seq_slot, state.shape[0], "seq_slot", active=used)
    closes = real & (torch.remainder(positions.long() + 1, p.ratio) == 0)
    slot, start = per_row(seq_slot, seq, real), per_row(seq_start, seq, real)
    width = kv.shape[1] // 2 if p.overlap else kv.shape[1]
    latent = kv.new_zeros(kv.shape[0] + 1, width)  # row T takes the padding of the unchecked count
    rows = _closing_rows(closes, p.ratio, seq_slot.shape[0])
    if rows.numel():
        span = window_span(p.ratio, p.overlap)
        safe = rows.clamp(max=max(kv.shape[0] - 1, 0))
        wkv_rows, gate_rows, pos = _window_projections(
            kv, gate, state, safe, positions, start, slot, seq, span
        )
        latent[rows] = _pool(p, wkv_rows, gate_rows, pos, ape)
    ring = _write_ring(state, kv, gate, positions, real, seq, slot, seq_slot.shape[0])
    return latent[:-1], closes, ring


def visible_entries(p: Any, positions: Tensor, seq_ids: Tensor) -> Tensor:
    entry = torch.arange(p.width, device=positions.device)
    count = torch.div(positions.long() + 1, p.ratio, rounding_mode="floor")
    keep = (entry.unsqueeze(0) < count.unsqueeze(1)) & (seq_ids >= 0).unsqueeze(1)
    return torch.where(keep, entry, -1).to(torch.int32)


RULES: dict[str, Any] = {"window_compress": window_compress, "visible_entries": visible_entries}
INPLACE_RULES: dict[str, Any] = {"window_compress": window_compress_into}
