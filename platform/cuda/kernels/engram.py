"""cuda rules of `engram_hash`, `gather_dequant_rows` and `engram_gate` (dsgraph.ops.engram): one Triton
kernel each (engram_tl.py) in place of the cpu rules' chains of small torch kernels (about 30 launches
per Engram layer for the gate alone).

- gather_dequant_rows reads the table wherever its address points: device memory, or pinned host memory
  (the cuda platform keeps large Engram tables there, `platform/cuda/placement.py`), zero-copy over PCIe.
  Bit-equal to the cpu rule (the decode is exact and the product is rounded once). With checks on, row
  ids outside the table raise the cpu rule's error first (one host read); unchecked, such a row gives 0.
  A table in host memory that is not page-locked cannot be read by the device: those calls gather on the
  host instead (a host sync, not capturable) and say so once.
- engram_hash: bit-equal (int64 throughout). With the rules' value checks on (eager runs, warm-up) the
  cpu rule runs, since it is the one that validates the step layout and token ids against the token map
  (host reads); unchecked (captured steps) the kernel runs.
- engram_gate: the cpu rule's f32 arithmetic per (token, stream); its sums over the hidden size run in
  fixed tiles, so results agree with the cpu rule within f32 rounding, not bit for bit.
Batch invariant: one program per token (hash), per row id and column block (gather), per token and
stream (gate).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from dsgraph.platform.cpu import rules_engram
from dsgraph.platform.cpu.dtypes import constant, to_torch
from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels.attention import runs_kernels, should_check
from dsgraph.platform.cuda.kernels.mhc import next_pow2, triton_cdiv, triton_dtype

__all__ = ["RULES", "engram_gate", "engram_hash", "gather_dequant_rows"]

GATE_BLOCK = 1024  # hidden columns per step of engram_gate's two passes
GATHER_BLOCK_D = 256  # columns per program: one V4.1 table row (256 FP8 bytes + 8 scale bytes)
NUM_WARPS = 4
_WARNED: set[str] = set()


def _host_fallback(p: Any, table: Tensor, scale: Tensor, rows: Tensor) -> Tensor:
    why = (
        "gather_dequant_rows: the table is in pageable host memory, which the device cannot address; "
        "gathering on the host (a sync per call, not capturable). Pin it (platform/cuda/placement.py)."
    )
    if why not in _WARNED:
        _WARNED.add(why)
        warnings.warn(why, stacklevel=2)
    return rules_engram.gather_dequant_rows(p, table, scale, rows.cpu()).to(rows.device)


def gather_dequant_rows(p: Any, table: Tensor, scale: Tensor, rows: Tensor) -> Tensor:
    if not runs_kernels(rows) or table.dim() != 2 or table.shape[1] % 32:
        return rules_engram.gather_dequant_rows(p, table, scale, rows)
    if rows.is_cuda and not table.is_cuda and not (table.is_pinned() and scale.is_pinned()):
        return _host_fallback(p, table, scale, rows)
    num_rows, width = table.shape
    if should_check(rows):
        bad = (rows < 0) | (rows >= num_rows)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise IndexError(
                f"gather_dequant_rows: rows{list(where)} = {int(rows[where])} is outside the table "
                f"[0, {num_rows})"
            )
    from dsgraph.platform.cuda.kernels import engram_tl as K

    out_dtype = to_torch(p.out_dtype)
    flat = rows.reshape(-1).contiguous()
    out = torch.empty((flat.shape[0], width), dtype=out_dtype, device=rows.device)
    if flat.shape[0] and width:
        block = min(GATHER_BLOCK_D, next_pow2(width))
        bf16 = out_dtype == torch.bfloat16  # written as int16 bits (engram_tl)
        K.gather_dequant_rows_kernel[(flat.shape[0], triton_cdiv(width, block))](
            table.contiguous().view(torch.uint8), scale.contiguous().view(torch.uint8), flat,
            out.view(torch.int16) if bf16 else out, num_rows,
            D=width, BLOCK_D=block, OUT=K.tl.int16 if bf16 else triton_dtype(out_dtype), num_warps=NUM_WARPS,
            **pdl.launch(),
        )  # fmt: skip
    return out.reshape(*rows.shape, width)


def _hash_tables(p: Any, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(primes, offsets) flattened order-major and the multipliers, as int64 tables on `device`."""
    primes = constant(tuple(v for order in p.primes for v in order), torch.int64, device)
    offsets = constant(tuple(v for order in p.offsets for v in order), torch.int64, device)
    return primes, offsets, constant(tuple(p.multipliers), torch.int64, device)


def engram_hash(
    p: Any,
    token_ids: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    seq_start: Tensor,
    lookback: Tensor,
    token_map: Tensor,
) -> Tensor:
    args = (token_ids, positions, seq_ids, seq_start, lookback, token_map)
    if not runs_kernels(token_ids) or should_check(token_ids) or token_map.numel() == 0:
        return rules_engram.engram_hash(p, *args)
    from dsgraph.platform.cuda.kernels import engram_tl as K

    heads, tokens = len(p.primes[0]), token_ids.shape[0]
    out = torch.empty((tokens, (p.max_ngram - 1) * heads), dtype=torch.int64, device=token_ids.device)
    if tokens:
        primes, offsets, multipliers = _hash_tables(p, token_ids.device)
        K.engram_hash_kernel[(tokens,)](
            *(a.contiguous() for a in args), primes, offsets, multipliers, out,
            seq_start.shape[0], token_map.shape[0], int(p.pad_id), int(p.image_token_id),
            M=p.max_ngram, HEADS=heads, BLOCK_H=next_pow2(heads), num_warps=1, **pdl.launch(),
        )  # fmt: skip
    return out


def engram_gate(p: Any, x: Tensor, kv: Tensor, qw: Tensor, kw: Tensor, token_ids: Tensor) -> Tensor:
    if not runs_kernels(x) or x.dim() != 3:
        return rules_engram.engram_gate(p, x, kv, qw, kw, token_ids)
    from dsgraph.platform.cuda.kernels import engram_tl as K

    tokens, streams, hidden = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if tokens and streams and hidden:
        K.engram_gate_kernel[(tokens, streams)](
            x.contiguous(), kv.contiguous(), qw.contiguous(), kw.contiguous(), token_ids.contiguous(), out,
            float(p.eps), float(hidden**-0.5), int(p.image_token_id), N=streams, H=hidden,
            BLOCK=min(GATE_BLOCK, next_pow2(hidden)), OUT=triton_dtype(x.dtype), num_warps=NUM_WARPS,
            enable_fp_fusion=False, **pdl.launch(),
        )  # fmt: skip
    return out


RULES: dict[str, Any] = {
    "engram_hash": engram_hash,
    "gather_dequant_rows": gather_dequant_rows,
    "engram_gate": engram_gate,
}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them)
KERNELS: dict[str, tuple[str, ...]] = {
    "engram_hash": ("engram_tl.engram_hash_kernel",),
    "gather_dequant_rows": ("engram_tl.gather_dequant_rows_kernel",),
    "engram_gate": ("engram_tl.engram_gate_kernel",),
}
