"""FlashMLA's SM90 sparse FP8 decode (the `sgl-flash-mla` wheel's legacy kernels) timed on the
nearest cache layout it supports: DeepSeek-V4.0's 584 B/token entries (448 FP8 values, 64 BF16 RoPE
values, 8 scale bytes). Nothing on Hopper reads V4.1's 528 B / 288 B layouts, so this is the yardstick
for our own sparse decode kernel at the same query count, heads, top-k and window.

The cache bytes are random in [0x30, 0x40): finite under every reading of the layout (FP8, BF16 and
E8M0 bytes alike), which is all a timing needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsgraph.tools.bench.timing import time_ms

V40_ENTRY_BYTES = 584
PAGE = 64


@dataclass(frozen=True)
class SparseDecodeCase:
    batch: int
    topk: int  # selected compressed entries per query
    window: int  # SWA keys per query (FlashMLA's "extra" cache)
    heads: int = 64
    head_dim: int = 512
    context: int = 32768  # entries the indices are drawn from


def available() -> str | None:
    """None when FlashMLA's legacy SM90 kernels load, else why not."""
    try:
        import flash_mla  # noqa: F401

        if not flash_mla.has_legacy():
            return "flash_mla has no legacy (SM90) kernels in this build"
    except Exception as exc:  # the wheel is optional: report why it is absent
        return f"flash_mla not importable: {type(exc).__name__}: {exc}"
    return None


def _cache(entries: int, gen: torch.Generator) -> torch.Tensor:
    blocks = -(-entries // PAGE)
    raw = torch.randint(0x30, 0x40, (blocks, PAGE, 1, V40_ENTRY_BYTES), generator=gen, device="cuda")
    return raw.to(torch.uint8).view(torch.float8_e4m3fn)


def _indices(case: SparseDecodeCase, count: int, span: int, gen: torch.Generator) -> torch.Tensor:
    keys = torch.rand(case.batch, span, generator=gen, device="cuda")
    return keys.topk(count, dim=1).indices.to(torch.int32).view(case.batch, 1, count)


def time_flashmla(case: SparseDecodeCase, seed: int = 0) -> float:
    """Milliseconds of one decode call (main top-k plus the window as the extra cache)."""
    import flash_mla

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(case.batch, 1, case.heads, case.head_dim, generator=gen, device="cuda").bfloat16()
    main = _cache(case.context, gen)
    extra = _cache(case.batch * case.window, gen)
    idx = _indices(case, case.topk, case.context, gen)
    base = torch.arange(case.batch, device="cuda", dtype=torch.int32).view(-1, 1, 1) * case.window
    extra_idx = base + torch.arange(case.window, device="cuda", dtype=torch.int32).view(1, 1, -1)
    sink = torch.zeros(case.heads, device="cuda")
    meta, _ = flash_mla.get_mla_metadata()

    def call() -> object:
        return flash_mla.flash_mla_with_kvcache(
            q, main, None, None, case.head_dim, meta,
            indices=idx, attn_sink=sink, extra_k_cache=extra, extra_indices_in_kvcache=extra_idx,
            use_legacy=True, kv_format="V4",
        )  # fmt: skip

    return time_ms(call, repeats=20)


def bytes_read(case: SparseDecodeCase, entry_bytes: int, window_entry_bytes: int) -> int:
    """Cache bytes one decode call must read (queries and outputs are negligible next to it)."""
    return case.batch * (case.topk * entry_bytes + case.window * window_entry_bytes)
