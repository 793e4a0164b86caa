"""Reference meaning of the Engram ops (dsgraph.ops.engram), in torch (spec model-v41 4.3).

Hashing is int64 end to end: the multipliers are ~2^46 and a float anywhere changes every row.
"""

from __future__ import annotations

from typing import Any

import torch

from dsgraph.platform.cpu import invariant
from dsgraph.platform.cpu.dtypes import constant, to_torch
from dsgraph.platform.cpu.quant import fp8_rows_dequantize
from dsgraph.platform.cpu.step_rows import checking

Tensor = torch.Tensor

_INT64_LIMIT = 1 << 63
# NeMo's (and the vendor's) floor under |d| before the signed square root of the gate.
_GATE_FLOOR = 1e-6


def _check_layout(positions: Tensor, seq_ids: Tensor, seq_start: Tensor, real: Tensor) -> None:
    """Real rows: a valid sequence, and positions at or after the sequence's chunk start."""
    num_seqs = seq_start.shape[0]
    bad = real & (seq_ids >= num_seqs)
    if checking() and bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise IndexError(f"engram_hash: row {t} has seq_id {int(seq_ids[t])}, outside [0, {num_seqs})")
    start = seq_start[seq_ids.clamp(0, max(num_seqs - 1, 0)).long()] if num_seqs else positions
    bad = real & (positions < start)
    if checking() and bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ValueError(
            f"engram_hash: row {t} has position {int(positions[t])} before its sequence's chunk start "
            f"seq_start[{int(seq_ids[t])}] = {int(start[t])}"
        )


def _shift_ids(
    shift: int, token_ids: Tensor, positions: Tensor, seq_ids: Tensor, seq_start: Tensor, lookback: Tensor
) -> tuple[Tensor, Tensor]:
    """Raw ids [T] of the tokens `shift` positions back, and whether that slot is before position 0."""
    sid = seq_ids.clamp_min(0).long()
    start = seq_start[sid].long()
    source = positions.long() - shift
    in_chunk = source >= start
    row = torch.arange(token_ids.shape[0], device=token_ids.device) - shift
    # Rows of a sequence are contiguous and consecutive: position p - s of the chunk is row t - s.
    chunk_row = row.clamp_min(0)
    real = seq_ids >= 0
    mismatch = (
        real
        & in_chunk
        & ((row < 0) | (seq_ids[chunk_row] != seq_ids) | (positions[chunk_row].long() != source))
    )
    if checking() and bool(mismatch.any()):
        t = int(mismatch.nonzero()[0])
        raise ValueError(
            f"engram_hash: row {t} (seq {int(seq_ids[t])}, position {int(positions[t])}) expects position "
            f"{int(source[t])} of its chunk at row {int(row[t])}; "
            "rows of a sequence must be contiguous and consecutive"
        )
    back = lookback[sid, (start - source - 1).clamp(0, lookback.shape[1] - 1)]
    return torch.where(in_chunk, token_ids[chunk_row], back).long(), source < 0


def _compress(
    p: Any, raw: Tensor, before_start: Tensor, token_map: Tensor, real: Tensor, shift: int
) -> Tensor:
    """Compressed ids [T] of one shift, -1 where blocked (before 0, -1 lookback, image token)."""
    blocked = before_start | (raw < 0) | ((raw == p.image_token_id) if p.image_token_id >= 0 else False)
    bad = real & ~blocked & (raw >= token_map.shape[0])
    if checking() and bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise IndexError(
            f"engram_hash: row {t}, shift {shift}: token id {int(raw[t])} is outside the token map "
            f"[0, {token_map.shape[0]})"
        )
    return torch.where(blocked, -1, token_map.long()[raw.clamp(0, token_map.shape[0] - 1)])


def _check_token_map(p: Any, token_map: Tensor) -> None:
    if not checking():
        return
    if not token_map.numel():
        raise ValueError("engram_hash: token_map is empty")
    low, high = int(token_map.min()), int(token_map.max())
    if low < 0 or high * max(p.multipliers) >= _INT64_LIMIT:
        raise ValueError(
            f"engram_hash: token_map values span [{low}, {high}]; they must be >= 0 and "
            f"value * max multiplier {max(p.multipliers)} must stay below 2^63"
        )


def engram_hash(
    p: Any,
    token_ids: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    seq_start: Tensor,
    lookback: Tensor,
    token_map: Tensor,
) -> Tensor:
    _check_token_map(p, token_map)
    real = seq_ids >= 0
    _check_layout(positions, seq_ids, seq_start, real)
    heads = len(p.primes[0])
    out = token_ids.new_zeros((token_ids.shape[0], (p.max_ngram - 1) * heads), dtype=torch.int64)
    if checking() and not bool(real.any()):
        return out
    blocked = token_ids.new_zeros(token_ids.shape, dtype=torch.bool)
    rolling = token_ids.new_zeros(token_ids.shape, dtype=torch.int64)
    for shift in range(p.max_ngram):
        raw, before_start = _shift_ids(shift, token_ids, positions, seq_ids, seq_start, lookback)
        compressed = _compress(p, raw, before_start, token_map, real, shift)
        blocked = blocked | (compressed < 0)  # sticky: a blocked shift blocks every larger one
        product = torch.where(blocked, p.pad_id, compressed) * p.multipliers[shift]
        rolling = torch.bitwise_xor(rolling, product)
        if shift == 0:
            continue
        primes = constant(tuple(p.primes[shift - 1]), torch.int64, token_ids.device)
        offsets = constant(tuple(p.offsets[shift - 1]), torch.int64, token_ids.device)
        out[:, (shift - 1) * heads : shift * heads] = rolling[:, None] % primes + offsets
    return torch.where(real[:, None], out, 0)


def gather_dequant_rows(p: Any, table: Tensor, scale: Tensor, rows: Tensor) -> Tensor:
    bad = (rows < 0) | (rows >= table.shape[0])
    if checking() and bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise IndexError(
            f"gather_dequant_rows: rows{list(where)} = {int(rows[where])} is outside the table "
            f"[0, {table.shape[0]})"
        )
    flat = rows.reshape(-1)
    values = fp8_rows_dequantize(table[flat], scale[flat], torch.float32)
    return values.reshape(*rows.shape, table.shape[1]).to(to_torch(p.out_dtype))


def engram_gate(p: Any, x: Tensor, kv: Tensor, qw: Tensor, kw: Tensor, token_ids: Tensor) -> Tensor:
    streams, hidden = x.shape[1], x.shape[2]
    hidden_f = x.float()
    key = kv[:, : streams * hidden].float().unflatten(-1, (streams, hidden))
    value = kv[:, streams * hidden :].float()
    weight = qw.float() * kw.float()  # NeMo fuses the two weights first, as does the vendor kernel
    rstd = torch.rsqrt(hidden_f.square().mean(-1) + p.eps) * torch.rsqrt(key.square().mean(-1) + p.eps)
    dot = (hidden_f * weight * key).sum(-1) * rstd * hidden**-0.5
    # copysign keeps d == -0.0 negative; sign(0) = 0 would give 0.5 instead (numerics 4c edge).
    gate = invariant.sigmoid(torch.copysign(dot.abs().clamp_min(_GATE_FLOOR).sqrt(), dot))
    masked = token_ids < 0
    if p.image_token_id >= 0:
        masked = masked | (token_ids == p.image_token_id)
    gate = gate.masked_fill(masked[:, None], 0.0)
    return (hidden_f + gate[..., None] * value[:, None, :]).to(x.dtype)


RULES: dict[str, Any] = {
    "engram_hash": engram_hash,
    "gather_dequant_rows": gather_dequant_rows,
    "engram_gate": engram_gate,
}
