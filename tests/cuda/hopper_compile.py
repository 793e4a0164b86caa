"""Compile H5c's Triton kernels (attention, indexer, cache writes) for Hopper (sm_90) without a GPU.

Triton's interpreter, which runs the kernel tests on CPU machines, accepts code the compiler refuses;
this script runs the real front end and back end (down to PTX and cubin with the ptxas Triton ships).
It must run without TRITON_INTERPRET (under it @triton.jit builds interpreted functions), so
test_attention.py starts it in a subprocess. Prints one line per kernel; exits 1 on the first failure.
Usage: python tests/cuda/hopper_compile.py [head_dim] (default 512)
"""

from __future__ import annotations

import sys
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsgraph.platform.cuda.kernels import attention_tl, cache_tl, indexer_tl

HOPPER = GPUTarget("cuda", 90, 32)
HOPPER_SHARED_BYTES = 227 * 1024  # the most shared memory one block may take on sm_90
STEP = ("pos_ptr", "seq_ptr", "slot_ptr", "start_ptr", "first_ptr", "table_ptr", "topk_ptr")
SIZES = ("num_rows", "num_heads", "ring_len", "num_blocks", "block_size", "table_width", "topk_width")


def _compile(fn: Any, types: dict[str, str], constexprs: dict[str, Any], num_warps: int) -> None:
    signature = {**types, **{name: "constexpr" for name in constexprs}}
    kernel = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs),
        target=HOPPER,
        options={"num_warps": num_warps},
    )
    if kernel.metadata.shared > HOPPER_SHARED_BYTES:
        raise SystemExit(
            f"{fn.__name__} {constexprs}: needs {kernel.metadata.shared} B of shared memory, "
            f"expected <= {HOPPER_SHARED_BYTES} (an sm_90 block's limit): it would fail at launch"
        )
    print(f"{fn.__name__}: ok, {kernel.metadata.shared} B shared", flush=True)


def _attention(head_dim: int, dtype: str) -> None:
    from dsgraph.platform.cuda.kernels import attention as rule

    dot = 0 if dtype == "fp32" else 1
    block_c = triton.next_power_of_2(head_dim // 2)
    shapes = dict(HEAD_DIM=head_dim, BLOCK_C=block_c)
    # The tiles attention.launch picks (f32 queries take smaller ones).
    block_h, block_n = (16, rule.F32_BLOCK_N) if dtype == "fp32" else (rule.BLOCK_H, rule.BLOCK_N)
    meta = dict(NUM_SPLITS=5, WINDOW=128, BLOCK_N=block_n, SPLIT_TILES=rule.SPLIT_TILES, HAS_POOL=True,
                DOT=dot, BLOCK_H=block_h, **shapes)  # fmt: skip
    inputs = {"q_ptr": f"*{dtype}", "kv_ptr": f"*{dtype}", "ring_ptr": "*u8", "pool_ptr": "*u8"}
    step = {name: "*i32" for name in STEP}
    sizes = {**{name: "i32" for name in SIZES}, "scale_log2": "fp32"}
    state = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"}
    _compile(attention_tl.split_kernel, {**inputs, **step, **state, **sizes}, meta, rule.NUM_WARPS)
    fused = {**inputs, "sink_ptr": "*fp32", **step, "out_ptr": f"*{dtype}", **sizes}
    _compile(attention_tl.fused_kernel, fused, meta, rule.NUM_WARPS)
    merge = {**state, "sink_ptr": "*fp32", "out_ptr": f"*{dtype}", "num_heads": "i32"}
    _compile(attention_tl.merge_kernel, merge, dict(NUM_SPLITS=5, BLOCK_H=rule.MERGE_H, **shapes), 4)


def _indexer(dtype: str) -> None:
    types = {
        "q_ptr": f"*{dtype}",
        "w_ptr": "*fp32",
        "keys_ptr": "*u8",
        "table_ptr": "*i32",
        "pos_ptr": "*i32",
    }
    types |= {"seq_ptr": "*i32", "out_ptr": "*fp32"}
    types |= {name: "i32" for name in ("num_heads", "num_blocks", "block_size", "table_width", "ratio")}
    meta = dict(HEAD_DIM=128, BLOCK_H=32, BLOCK_D=128, BLOCK_E=64, DOT=0 if dtype == "fp32" else 1)
    _compile(indexer_tl.index_scores_kernel, types, meta, 4)


def _cache() -> None:
    entry = dict(ENTRY_BYTES=528, BLOCK=1024)
    step = {"pos_ptr": "*i32", "seq_ptr": "*i32", "slot_ptr": "*i32", "end_ptr": "*i32"}
    swa = {"ring_ptr": "*u8", "entries_ptr": "*u8", **step, "num_slots": "i32", "ring_len": "i32"}
    _compile(cache_tl.swa_write_kernel, swa, entry, 4)
    paged = {"pool_ptr": "*u8", "entries_ptr": "*u8", "entry_ptr": "*i32", "valid_ptr": "*u8"}
    paged |= {"seq_ptr": "*i32", "table_ptr": "*i32", "num_blocks": "i32", "block_size": "i32"}
    _compile(cache_tl.paged_write_kernel, {**paged, "table_width": "i32"}, entry, 4)
    state = {"state_ptr": "*fp32", "kv_ptr": "*fp32", "gate_ptr": "*fp32", "write_ptr": "*u8"}
    state |= {"pos_ptr": "*i32", "slot_ptr": "*i32", "num_slots": "i32", "ring_len": "i32"}
    _compile(cache_tl.compress_state_kernel, state, dict(WIDTH=512, BLOCK=512), 4)


def main(argv: list[str]) -> int:
    head_dim = int(argv[1]) if len(argv) > 1 else 512  # the real width: shared-memory limits show there
    for dtype in ("bf16", "fp32"):
        _attention(head_dim, dtype)
        _indexer(dtype)
    _cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
