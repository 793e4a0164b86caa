"""cuda rules of `swa_write`, `paged_write` and `compress` (dsgraph.ops.cache), and of the fused
`encode_swa_write` / `encode_paged_write` (ops/fused.py: the write kernels encoding each row's values as
cache_encode's kernel does). The cache writes are Triton row copies into the cache operand, in place
(the cuda platform's INPLACE contract: the rule writes operand 0 and returns it), with no host sync
and no data-dependent shape, so a step that writes caches stays one CUDA graph.

Checks (seq_ids, ring slots / entry placement, one write per cache row) raise the cpu rules' errors
unless `step_rows.unchecked()` is active or a CUDA graph is being captured; unchecked, a row whose
target is out of range writes nothing.

`compress` (in place on its state operand for ratio 2): the projections through the cuda `linear` rule
(dense weight, f32 output: IEEE f32 dots, fixed tiles), then one Triton launch that writes latent in its
dtype and closes: ratio 1's row mask (cache_tl.compress_rows_kernel), ratio 2's pooling
(cache_tl.compress_pool_kernel: the cpu rule's first-token lookup and f64 softmax of two gates) before
the state ring's update by a Triton row copy; no host sync, no data-dependent shape. `compress_norm`
(ops/fused.py) runs the compressor's norm of each latent row in that same launch, after the row is
stored (rms_norm_kernel's helpers and tiles: its bits).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dsgraph.graph.op import NoParams
from dsgraph.ops.fused import compress_params
from dsgraph.ops.nn import LinearParams
from dsgraph.ops.quant import GROUP_SIZES
from dsgraph.ops.quant import entry_bytes as entry_size
from dsgraph.platform.cpu import rules_cache, rules_fused, rules_window
from dsgraph.platform.cpu.dtypes import to_torch
from dsgraph.platform.cpu.step_rows import (
    per_row,
    real_rows,
    require_in_range,
    require_unique,
    rowwise_linear,
)
from dsgraph.platform.cuda import pdl
from dsgraph.platform.cuda.kernels import quant_act
from dsgraph.platform.cuda.kernels.attention import runs_kernels, should_check

NUM_WARPS = 4


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _require_contiguous(cache: Tensor, op: str, what: str) -> None:
    """Written in place through its base pointer: a strided view would be written in the wrong places."""
    if not cache.is_contiguous():
        raise ValueError(f"{op}: {what} {tuple(cache.shape)} is not contiguous, expected a contiguous buffer")


# the kernels' arguments for copying entry bytes (no encoding)
_COPY = dict(ENCODE=False, D=1, FMT=0, GROUP=1, BLOCK_G=1)
BLOCK_G = 16  # groups per step of an encoding write


def _encoding(fmt: str, values: Tensor, entry_bytes: int) -> dict[str, Any] | None:
    """The write kernels' arguments for encoding `values` [rows, D] in `fmt` (cache_encode's kernel), or
    None where that kernel does not apply (the rule then encodes, then writes)."""
    from dsgraph.platform.cuda.kernels.quant_act import FORMATS

    width = values.shape[-1]
    if (
        fmt not in FORMATS
        or values.dim() != 2
        or width % GROUP_SIZES[fmt]
        or entry_bytes != entry_size(fmt, width)
    ):
        return None
    return dict(ENCODE=True, D=width, FMT=FORMATS[fmt], GROUP=GROUP_SIZES[fmt], BLOCK_G=BLOCK_G)


def _launch_swa(ring: Tensor, src: Tensor, *step: Tensor, entry_bytes: int, how: dict) -> Tensor:
    """swa_write_kernel: src holds the entries (copied) or the values (encoded, `how`)."""
    positions, seq_ids, seq_slot, seq_end = step
    from dsgraph.platform.cuda.kernels import cache_tl as K

    _require_contiguous(ring, "swa_write", "ring")
    if should_check(src):
        rules_cache.check_swa_write(ring, positions, seq_ids, seq_slot, seq_end)
    if src.shape[0] and seq_slot.shape[0]:
        K.swa_write_kernel[(src.shape[0],)](
            ring, src.contiguous(), positions, seq_ids, seq_slot, seq_end, ring.shape[0], ring.shape[1],
            ENTRY_BYTES=entry_bytes, BLOCK=_next_pow2(entry_bytes), **how, num_warps=NUM_WARPS,
            **pdl.launch(),
        )  # fmt: skip
    return ring


def swa_write(
    p: Any,
    ring: Tensor,
    entries: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    seq_slot: Tensor,
    seq_end: Tensor,
) -> Tensor:
    if not runs_kernels(entries):
        return rules_cache.swa_write_into(p, ring, entries, positions, seq_ids, seq_slot, seq_end)
    step = (positions, seq_ids, seq_slot, seq_end)
    return _launch_swa(ring, entries, *step, entry_bytes=entries.shape[1], how=_COPY)


def encode_swa_write(p: Any, ring: Tensor, values: Tensor, *operands: Tensor) -> Tensor:
    """cache_encode, then swa_write of its entries, in one launch (ops/fused.py)."""
    how = _encoding(p.fmt, values, ring.shape[2]) if runs_kernels(values) else None
    if how is None:
        return swa_write(NoParams(), ring, quant_act.cache_encode(p, values), *operands)
    return _launch_swa(ring, values, *operands, entry_bytes=ring.shape[2], how=how)


def _launch_paged(pool: Tensor, src: Tensor, *step: Tensor, entry_bytes: int, how: dict) -> Tensor:
    """paged_write_kernel: src holds the entries (copied) or the values (encoded, `how`)."""
    entry_ids, valid, seq_ids, block_table = step
    from dsgraph.platform.cuda.kernels import cache_tl as K

    _require_contiguous(pool, "paged_write", "pool")
    if should_check(src):
        rules_cache.check_paged_write(pool, entry_ids, valid, seq_ids, block_table)
    if src.shape[0] and block_table.shape[0]:
        K.paged_write_kernel[(src.shape[0],)](
            pool, src.contiguous(), entry_ids, valid.contiguous().view(torch.uint8), seq_ids,
            block_table.contiguous(), pool.shape[0], pool.shape[1], block_table.shape[1],
            ENTRY_BYTES=entry_bytes, BLOCK=_next_pow2(entry_bytes), **how, num_warps=NUM_WARPS,
            **pdl.launch(),
        )  # fmt: skip
    return pool


def paged_write(
    p: Any,
    pool: Tensor,
    entries: Tensor,
    entry_ids: Tensor,
    valid: Tensor,
    seq_ids: Tensor,
    block_table: Tensor,
) -> Tensor:
    if not runs_kernels(entries):
        return rules_cache.paged_write_into(p, pool, entries, entry_ids, valid, seq_ids, block_table)
    step = (entry_ids, valid, seq_ids, block_table)
    return _launch_paged(pool, entries, *step, entry_bytes=entries.shape[1], how=_COPY)


def encode_paged_write(p: Any, pool: Tensor, values: Tensor, *operands: Tensor) -> Tensor:
    """cache_encode, then paged_write of its entries, in one launch (ops/fused.py)."""
    how = _encoding(p.fmt, values, pool.shape[2]) if runs_kernels(values) else None
    if how is None:
        return paged_write(NoParams(), pool, quant_act.cache_encode(p, values), *operands)
    return _launch_paged(pool, values, *operands, entry_bytes=pool.shape[2], how=how)


def _project(u: Tensor, *weights: Tensor) -> tuple[Tensor, ...]:
    """`u [T, H] . w [D, H]^T` for each weight, in f32 (IEEE f32 products of the operands read as f32),
    batch invariant: the cuda linear kernel (a pair of weights in one launch), else the cpu helper. The
    kernel reads a bf16 u as f32 itself when w is f32 (its f32 dot); with a bf16 w too it would take bf16
    tensor-core dots, so u is cast first."""
    try:
        from dsgraph.platform.cuda.kernels.linear import dense_pair, linear
    except ImportError:
        return tuple(rowwise_linear(u, w) for w in weights)
    if weights[0].dtype != torch.float32:
        u = u.float()
    p = LinearParams(weight_format="dense", act_quant="none", out_dtype="f32")
    if len(weights) == 2:
        return dense_pair(p, u, *weights)
    return (linear(p, u, weights[0]),)


def _used_seqs(seq: Tensor, real: Tensor, num_seqs: int) -> Tensor:
    used = torch.zeros(num_seqs, dtype=torch.bool, device=seq.device)
    used[seq[real]] = True
    return used


def _newest(positions: Tensor, seq_ids: Tensor, num_seqs: int) -> Tensor:
    """int64 [num_seqs]: each sequence's newest position in the step (-1: none), by torch ops (checks)."""
    real, seq = seq_ids >= 0, seq_ids.clamp_min(0).long()
    last = torch.full((max(num_seqs, 1),), -1, dtype=torch.long, device=positions.device)
    return last.scatter_reduce(0, seq, torch.where(real, positions.long(), -1), "amax")


def _check_state_rows(positions: Tensor, seq_ids: Tensor, seq_slot: Tensor, ring_len: int) -> None:
    """One write per state ring row (the cpu rule's error)."""
    real, seq = seq_ids >= 0, seq_ids.clamp_min(0).long()
    last = _newest(positions, seq_ids, seq_slot.shape[0])
    pos, slot = positions.long(), per_row(seq_slot, seq, real)
    rows = (real & (pos > last[seq] - ring_len)).nonzero().squeeze(1)
    require_unique(
        "compress", slot[rows] * ring_len + pos[rows] % ring_len, rows, "one compressor state ring row"
    )


def _write_state(state: Tensor, kv: Tensor, gate: Tensor, operands: tuple[Tensor, ...], last: Tensor) -> None:
    """The cpu rule's ring update: each sequence's rows among the C newest positions of its chunk (last:
    each sequence's newest position, from the pooling kernel)."""
    from dsgraph.platform.cuda.kernels import cache_tl as K

    positions, seq_ids, seq_slot, _ = operands
    ring_len, num_seqs = state.shape[1], seq_slot.shape[0]
    if should_check(kv):
        _check_state_rows(positions, seq_ids, seq_slot, ring_len)
    width = kv.shape[1]
    K.compress_state_kernel[(kv.shape[0],)](
        state, kv.contiguous(), gate.contiguous(), positions.contiguous(), seq_ids.contiguous(),
        seq_slot.contiguous(), last, num_seqs, state.shape[0], ring_len, WIDTH=width,
        BLOCK=_next_pow2(width), num_warps=NUM_WARPS, **pdl.launch(),
    )  # fmt: skip


def _outputs(kv: Tensor, out: torch.dtype) -> tuple[Tensor, Tensor]:
    """compress's latent [T, D] in `out` and closes [T] bool, for its kernels to write."""
    latent = torch.empty(kv.shape, dtype=out, device=kv.device)
    return latent, torch.empty(kv.shape[0], dtype=torch.bool, device=kv.device)


def _pool(
    state: Tensor, kv: Tensor, gate: Tensor, operands: tuple[Tensor, ...], out: torch.dtype, norm: Norm
) -> tuple[Tensor, ...]:
    """Ratio 2's (latent [T, D] out, or its norm, closes [T] bool, each sequence's newest position [S]
    i32) in one launch, reading the ring before its update."""
    from dsgraph.platform.cuda.kernels import cache_tl as K

    positions, seq_ids, seq_slot, seq_start = (t.contiguous() for t in operands)
    latent, closes = _outputs(kv, out)
    normed, norm_args = _norm_args(latent, norm)
    last = torch.full((max(seq_slot.shape[0], 1),), -1, dtype=torch.int32, device=kv.device)
    width = kv.shape[1]
    K.compress_pool_kernel[(kv.shape[0],)](
        latent, closes.view(torch.uint8), last, kv.contiguous(), gate.contiguous(), state, positions, seq_ids,
        seq_slot, seq_start, seq_slot.shape[0], state.shape[0], state.shape[1], *norm_args, WIDTH=width,
        BLOCK=_next_pow2(width), NORM_BLOCK=_norm_block(width, norm), num_warps=NUM_WARPS,
        enable_fp_fusion=False, **pdl.launch(),
    )  # fmt: skip
    return normed, closes, last


def _rows(kv: Tensor, seq_ids: Tensor, out: torch.dtype, norm: Norm) -> tuple[Tensor, Tensor]:
    """Ratio 1's (latent [T, D] out, or its norm, closes [T] bool) from the projection kv [T, D] f32 in
    one launch."""
    from dsgraph.platform.cuda.kernels import cache_tl as K

    latent, closes = _outputs(kv, out)
    normed, norm_args = _norm_args(latent, norm)
    if kv.shape[0]:
        width = kv.shape[1]
        K.compress_rows_kernel[(kv.shape[0],)](
            latent, closes.view(torch.uint8), kv.contiguous(), seq_ids.contiguous(), *norm_args, WIDTH=width,
            BLOCK=_next_pow2(width), NORM_BLOCK=_norm_block(width, norm), num_warps=NUM_WARPS,
            enable_fp_fusion=False, **pdl.launch(),
        )  # fmt: skip
    return normed, closes


# compress_norm's norm: (weight [D], eps), or None for compress alone
Norm = tuple[Tensor, float] | None


def _norm_block(width: int, norm: Norm) -> int:
    """The compress kernels' NORM_BLOCK: rms_norm_kernel's BLOCK for this width (0: no norm)."""
    from dsgraph.platform.cuda.kernels.norm_rope import NORM_BLOCK

    return 0 if norm is None else min(NORM_BLOCK, _next_pow2(width))


def _norm_args(latent: Tensor, norm: Norm) -> tuple[Tensor, tuple[Any, ...]]:
    """The output the compress kernels return (the latent, or a new tensor for its norm) and their norm
    operands (weight, normed, eps; the latent twice and 0 when there is no norm: never read)."""
    if norm is None:
        return latent, (latent, latent, 0.0)
    normed = torch.empty_like(latent)
    return normed, (norm[0].contiguous(), normed, float(norm[1]))


def compress(p: Any, *operands: Tensor) -> tuple[Tensor, ...]:
    if not runs_kernels(operands[0]):
        return rules_cache.compress_into(p, *operands)
    return _compress(p, operands, None)


def compress_norm(p: Any, *operands: Tensor) -> tuple[Tensor, ...]:
    """compress, then the compressor's norm of its latent (ops/fused.py), in compress's launches."""
    if not runs_kernels(operands[0]):
        return rules_fused.compress_norm_into(p, *operands)
    return _compress(compress_params(p), operands[:-1], (operands[-1], p.eps))


def _compress(p: Any, operands: tuple[Tensor, ...], norm: Norm) -> tuple[Tensor, ...]:
    u, wkv = operands[0], operands[1]
    positions, seq_ids, seq_slot, seq_start = step = operands[-4:]
    checked = should_check(u)
    if checked:  # its error for a bad seq_id; the rows' sequences for the checks below
        real, seq = real_rows("compress", seq_ids, seq_slot.shape[0])
    out = to_torch(p.out_dtype)
    if p.ratio == 1:
        (kv,) = _project(u, wkv)
        return _rows(kv, seq_ids, out, norm)
    wgate, state = operands[2], operands[3]
    _require_contiguous(state, "compress", "state")
    if checked:
        used = _used_seqs(seq, real, seq_slot.shape[0])
        require_in_range("compress", seq_slot, state.shape[0], "seq_slot", active=used)
        closing = real & (positions % 2 == 1)
        rules_cache.check_closing_rows(positions, closing, per_row(seq_start, seq, real), seq)
    kv, gate = _project(u, wkv, wgate)  # one launch for both
    if not kv.shape[0]:
        return kv.to(out), seq_ids >= 0, state
    latent, closes, last = _pool(state, kv, gate, step, out, norm)
    _write_state(state, kv, gate, step, last)
    return latent, closes, state


def window_compress(
    p: Any, u: Tensor, wkv: Tensor, wgate: Tensor, ape: Tensor, state: Tensor, *step: Tensor
) -> tuple[Tensor, ...]:
    """V4's compressor (ops/window_compress.py): its two projections through the linear kernel (batch
    invariant, as the cpu rule's row-by-row products are; a GEMM, where those are T matrix-vector
    products: a 16k prefill chunk's took seconds), then the cpu rule's pooling and state writes, which
    read no host value when unchecked (capturable)."""
    if not runs_kernels(u):
        return rules_window.window_compress_into(p, u, wkv, wgate, ape, state, *step)
    return rules_window.pool_windows(p, *_project(u, wkv, wgate), ape, state, *step)


RULES: dict[str, Any] = {
    "swa_write": swa_write,
    "paged_write": paged_write,
    "encode_swa_write": encode_swa_write,
    "encode_paged_write": encode_paged_write,
    "compress": compress,
    "compress_norm": compress_norm,
    "window_compress": window_compress,
}
# op -> the Triton kernels its rule may launch (`dsgraph inspect --platform cuda` prints them); compress
# projects through the linear kernel and (ratio 2) pools, then writes its state ring
_COMPRESS_KERNELS = (
    "linear_tl.linear_kernel",
    "cache_tl.compress_rows_kernel",
    "cache_tl.compress_pool_kernel",
    "cache_tl.compress_state_kernel",
)
KERNELS: dict[str, tuple[str, ...]] = {
    "swa_write": ("cache_tl.swa_write_kernel",),
    "paged_write": ("cache_tl.paged_write_kernel",),
    "encode_swa_write": ("cache_tl.swa_write_kernel", "quant_act_tl.encode_kernel"),
    "encode_paged_write": ("cache_tl.paged_write_kernel", "quant_act_tl.encode_kernel"),
    "compress": _COMPRESS_KERNELS,
    "compress_norm": _COMPRESS_KERNELS,  # the norm runs in the rows / pool kernel
    "window_compress": ("linear_tl.linear_kernel",),
}
