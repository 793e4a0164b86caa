"""Compile the Triton kernels (attention, indexer, cache writes; the fused small ops: mHC, RMSNorm, RoPE,
activation/cache quantization) for Hopper (sm_90) without a GPU.

Triton's interpreter, which runs the kernel tests on CPU machines, accepts code the compiler refuses;
this script runs the real front end and back end (down to PTX and cubin with the ptxas Triton ships).
It must run without TRITON_INTERPRET (under it @triton.jit builds interpreted functions), so
test_attention.py starts it in a subprocess. Prints one line per kernel; exits 1 on the first failure.
The fused small-op kernels must also compile without register spills (ptxas -v on their PTX).
Usage: python tests/cuda/hopper_compile.py [head_dim] (default 512), or [moe] (the MoE kernels only, the
sweeps' candidate tiles too), or [linear] (every linear tile, the sweep's candidates too), or [select] (the
indexer's selections), or [attention NAME...] (attn_sweep's tilings, bf16 queries)
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsgraph.platform.cuda.kernels import (
    attention_tl,
    cache_tl,
    indexer_tl,
    mhc_tl,
    moe_tl,
    norm_rope_tl,
    quant_act_tl,
    select_tl,
)

HOPPER = GPUTarget("cuda", 90, 32)
HOPPER_SHARED_BYTES = 227 * 1024  # the most shared memory one block may take on sm_90


def _compile(
    fn: Any,
    types: dict[str, str],
    constexprs: dict[str, Any],
    num_warps: int,
    fusion: bool = True,
    num_stages: int | None = None,
    aligned: dict[str, int] | None = None,
) -> Any:
    """aligned: the integer arguments a launch passes as multiples of 16; with it, pointers are taken to
    be 16-byte aligned too, as Triton specializes them at launch (vectorized loads show)."""
    # the launch a GPU of sm_90 makes (platform/cuda/pdl.py): programmatic dependent launch, and the
    # GEMMs' weight prefetch
    launch = {"PDL": True, "PREFETCH": 1024}
    constexprs = {**{k: v for k, v in launch.items() if k in fn.arg_names}, **constexprs}
    signature = {**types, **{name: "constexpr" for name in constexprs}}
    options: dict[str, Any] = {"num_warps": num_warps, "enable_fp_fusion": fusion}
    if num_stages is not None:
        options["num_stages"] = num_stages
    attrs = {}
    if aligned is not None:
        names = [n for n, t in types.items() if t.startswith("*") or aligned.get(n, 1) % 16 == 0]
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}
    kernel = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=HOPPER,
        options=options,
    )
    if kernel.metadata.shared > HOPPER_SHARED_BYTES:
        raise SystemExit(
            f"{fn.__name__} {constexprs}: needs {kernel.metadata.shared} B of shared memory, "
            f"expected <= {HOPPER_SHARED_BYTES} (an sm_90 block's limit): it would fail at launch"
        )
    if constexprs.get("PDL") and "griddepcontrol.wait" not in kernel.asm["ptx"]:
        raise SystemExit(f"{fn.__name__} {constexprs}: PDL on, but no griddepcontrol.wait in its PTX")
    print(f"{fn.__name__}: ok, {kernel.metadata.shared} B shared", flush=True)
    return kernel


def _without_spills(
    fn: Any,
    types: dict[str, str],
    constexprs: dict[str, Any],
    num_warps: int = 4,
    fusion: bool = False,
    num_stages: int | None = None,
    aligned: dict[str, int] | None = None,
    fail: bool = True,
) -> None:
    """Compile as the rules launch (the fused small ops with fp-fusion off) and fail when ptxas reports
    spill stores (only print them unless `fail`)."""
    from triton.backends.nvidia.compiler import get_ptxas

    kernel = _compile(fn, types, constexprs, num_warps, fusion, num_stages, aligned)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as src:
        src.write(kernel.asm["ptx"])
        src.flush()
        cmd = [get_ptxas(90).path, "-v", "--fmad=false", "--gpu-name=sm_90a", src.name, "-o", src.name + ".o"]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", log))
    registers = re.findall(r"Used (\d+) registers", log)
    print(
        f"  {fn.__name__}: {registers[-1] if registers else '?'} registers, {spills} B spill stores",
        flush=True,
    )
    if spills and fail:
        raise SystemExit(f"{fn.__name__} {constexprs}: {spills} B of register spill stores, expected none")


def _attention(head_dim: int, dtype: str, tilings: dict[str, Any] | None = None) -> None:
    """The kernels at the tiles attention.launch picks for each of `tilings` (name -> attention.Tiles;
    default: the rule's TILES; f32 queries take smaller tiles). Register spills are printed, not refused:
    the attention tilings are ranked by attn_sweep's timings."""
    import torch

    from dsgraph.platform.cuda.kernels import attention as rule
    from dsgraph.tools.bench.attn_sweep import PAGE, SIZES, STEP

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    block_c = triton.next_power_of_2(head_dim // 2)
    shapes = dict(HEAD_DIM=head_dim, BLOCK_C=block_c)
    inputs = {"q_ptr": f"*{dtype}", "kv_ptr": f"*{dtype}", "ring_ptr": "*u8", "pool_ptr": "*u8"}
    step = {name: "*i32" for name in STEP}
    sizes = {**{name: "i32" for name in SIZES}, "scale_log2": "fp32"}
    state = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"}
    fused = {**inputs, "sink_ptr": "*fp32", **step, "out_ptr": f"*{dtype}", **sizes}
    for name, t in (tilings or {"default": rule.TILES}).items():
        block_h, block_n = (
            (16, min(t.block_n, rule.F32_BLOCK_N)) if dtype == "fp32" else (t.block_h, t.block_n)
        )
        splits = rule.num_splits(128, 512, block_n, t.split_tiles)
        meta = dict(NUM_SPLITS=splits, WINDOW=128, BLOCK_N=block_n, SPLIT_TILES=t.split_tiles, HAS_POOL=True,
                    DOT=rule.attention_dot(torch_dtype, t.key_ptx), BLOCK_H=block_h, DRAFT=0,
                    block_size=PAGE, **shapes)  # fmt: skip
        print(f"attention tiling {name} ({dtype}): {t}", flush=True)
        for fn, types in (
            (attention_tl.split_kernel, {**inputs, **step, **state, **sizes}),
            (attention_tl.fused_kernel, fused),
        ):
            _without_spills(fn, types, meta, t.num_warps, fusion=True, num_stages=t.num_stages, fail=False)
    # draft_attention's mode: SWA only, the DSpark block of 5 rows widening the window of 128
    t = rule.TILES
    block_h, block_n = (16, min(t.block_n, rule.F32_BLOCK_N)) if dtype == "fp32" else (t.block_h, t.block_n)
    splits = rule.num_splits(133, 0, block_n, t.split_tiles)
    # no pool: the launch passes the ring's length (138 here) as the pool's block size
    draft = dict(NUM_SPLITS=splits, WINDOW=133, BLOCK_N=block_n, SPLIT_TILES=t.split_tiles, HAS_POOL=False,
                 DOT=rule.attention_dot(torch_dtype, True), BLOCK_H=block_h, DRAFT=5,
                 block_size=138, **shapes)  # fmt: skip
    for fn, types in (
        (attention_tl.split_kernel, {**inputs, **step, **state, **sizes}),
        (attention_tl.fused_kernel, fused),
    ):
        _without_spills(fn, types, draft, t.num_warps, fusion=True, fail=False)
    merge = {**state, "sink_ptr": "*fp32", "out_ptr": f"*{dtype}", "num_heads": "i32"}
    _compile(attention_tl.merge_kernel, merge, dict(NUM_SPLITS=5, BLOCK_H=rule.MERGE_H, **shapes), 4)


def _indexer(dtype: str) -> None:
    types = {
        "q_ptr": f"*{dtype}",
        "w_ptr": "*fp32" if dtype == "fp32" else "*bf16",  # the head weights in the activation dtype
        "keys_ptr": "*u8",
        "table_ptr": "*i32",
        "pos_ptr": "*i32",
    }
    types |= {"seq_ptr": "*i32", "out_ptr": "*fp32"}
    types |= {name: "i32" for name in ("num_heads", "num_blocks", "block_size", "table_width", "ratio")}
    meta = dict(HEAD_DIM=128, BLOCK_H=32, BLOCK_D=128, BLOCK_E=64, DOT=0 if dtype == "fp32" else 1)
    _compile(indexer_tl.index_scores_kernel, types, meta, 4)


def _select() -> None:
    """The indexer's selections as the rules launch them (candidate blocks of 8 entries)."""
    from dsgraph.platform.cuda.kernels import indexer

    rows = {"width": "i32", "num_blocks": "i32", "block_size": "i32"}
    topk = {"scores_ptr": "*fp32", "out_ptr": "*i32", "width": "i32", "k": "i32"}
    mask = {"block_ptr": "*fp32", "scores_ptr": "*fp32", "out_ptr": "*u8", **rows, "k": "i32"}
    for width in (1024, 32768):  # the smallest tile (4 warps) and the widest (8 warps)
        block, block_s, warps = indexer._select_tiles(width, 8)
        _compile(select_tl.topk_select_kernel, topk, dict(BLOCK=block), warps)
        tiles = dict(BLOCK=block, BLOCK_S=block_s)
        scores = {"scores_ptr": "*fp32", "out_ptr": "*fp32", **rows}
        _compile(select_tl.block_scores_kernel, scores, tiles, warps)
        _compile(select_tl.block_mask_kernel, mask, tiles, warps)


def _cache() -> None:
    entry = dict(ENTRY_BYTES=528, BLOCK=1024)
    step = {"pos_ptr": "*i32", "seq_ptr": "*i32", "slot_ptr": "*i32", "end_ptr": "*i32"}
    swa = {"ring_ptr": "*u8", "entries_ptr": "*u8", **step, "num_slots": "i32", "ring_len": "i32"}
    copy = dict(ENCODE=False, D=1, FMT=0, GROUP=1, BLOCK_G=1)
    _compile(cache_tl.swa_write_kernel, swa, {**entry, **copy}, 4)
    # the fused encode_swa_write: the SWA ring's FP8 entries of 512 values from bf16
    encode = dict(ENCODE=True, D=512, FMT=0, GROUP=32, BLOCK_G=16)
    _compile(cache_tl.swa_write_kernel, {**swa, "entries_ptr": "*bf16"}, {**entry, **encode}, 4)
    paged = {"pool_ptr": "*u8", "entries_ptr": "*u8", "entry_ptr": "*i32", "valid_ptr": "*u8"}
    paged |= {"seq_ptr": "*i32", "table_ptr": "*i32", "num_blocks": "i32", "block_size": "i32"}
    _compile(cache_tl.paged_write_kernel, {**paged, "table_width": "i32"}, {**entry, **copy}, 4)
    # encode_paged_write: NVFP4 compressed entries (512) and MXFP4 index keys (128)
    for fmt, group, width in ((3, 16, 512), (1, 32, 128)):
        encode = dict(ENCODE=True, D=width, FMT=fmt, GROUP=group, BLOCK_G=16)
        size = width // 2 + width // group
        meta = dict(ENTRY_BYTES=size, BLOCK=1 << (size - 1).bit_length(), **encode)
        _compile(
            cache_tl.paged_write_kernel, {**paged, "entries_ptr": "*bf16", "table_width": "i32"}, meta, 4
        )
    rows = {"pos_ptr": "*i32", "seq_ptr": "*i32", "slot_ptr": "*i32"}
    state = {"state_ptr": "*fp32", "kv_ptr": "*fp32", "gate_ptr": "*fp32", **rows, "last_ptr": "*i32"}
    state |= {"num_seqs": "i32", "num_slots": "i32", "ring_len": "i32"}
    _compile(cache_tl.compress_state_kernel, state, dict(WIDTH=512, BLOCK=512), 4)
    for latent in ("*fp32", "*bf16"):  # reference and serving numerics' latent
        pool = {
            "latent_ptr": latent,
            "closes_ptr": "*u8",
            "last_ptr": "*i32",
            "kv_ptr": "*fp32",
            "gate_ptr": "*fp32",
        }
        pool |= {"state_ptr": "*fp32", **rows, "start_ptr": "*i32"}
        pool |= {"num_seqs": "i32", "num_slots": "i32", "ring_len": "i32"}
        # compress_norm's norm in the same launch (NORM_BLOCK > 0), or none
        norm = {"norm_w_ptr": latent, "normed_ptr": latent, "eps": "fp32"}
        one = {"latent_ptr": latent, "closes_ptr": "*u8", "kv_ptr": "*fp32", "seq_ptr": "*i32", **norm}
        for norm_block in (0, 512):
            meta = dict(WIDTH=512, BLOCK=512, NORM_BLOCK=norm_block)
            _compile(cache_tl.compress_pool_kernel, {**pool, **norm}, meta, 4, fusion=False)
            _compile(cache_tl.compress_rows_kernel, one, meta, 4, fusion=False)


def _fused() -> None:
    """The decode shapes: hidden 5120, hc_mult 4, head 512 with rope 64, index head 128."""
    import triton.language as tl

    from dsgraph.platform.cuda.kernels import mhc, norm_rope

    f32, bf16 = "*fp32", "*bf16"
    pre = {"x_ptr": bf16, "fn_ptr": f32, "part_ptr": f32, "count_ptr": "*i32", "base_ptr": f32}
    pre |= {
        "scale_ptr": f32,
        "pre_ptr": f32,
        "post_ptr": f32,
        "comb_ptr": f32,
        "eps": "fp32",
        "norm_eps": "fp32",
    }
    pre |= {"y_ptr": bf16, "old_ptr": bf16, "post_in_ptr": f32, "comb_in_ptr": f32}
    meta = dict(K=4 * 5120, R=24, RP=32, SPLIT=mhc.SPLIT, BLOCK_K=mhc.BLOCK_K, N=4, NP=4, ITERS=20)
    for expand in (False, True):  # hc_pre, hc_expand_pre
        _without_spills(
            mhc_tl.hc_pre_kernel, pre, {**meta, "EXPAND": expand, "OUT": tl.bfloat16}, mhc.NUM_WARPS
        )
    hc = dict(N=4, BLOCK=mhc.BLOCK_H, OUT=tl.bfloat16)
    collapse = {"x_ptr": bf16, "a_ptr": f32, "out_ptr": bf16, "H": "i32"}
    _without_spills(mhc_tl.hc_collapse_kernel, collapse, hc)
    for x in (bf16, f32):
        expand = {"y_ptr": bf16, "x_ptr": x, "post_ptr": f32, "comb_ptr": f32, "out_ptr": x, "H": "i32"}
        _without_spills(
            mhc_tl.hc_expand_kernel, expand, {**hc, "OUT": tl.float32 if x == f32 else tl.bfloat16}
        )
    # the plain ops (QDQ -1) and the fused ones quantizing their result (ops/fused.py) in FP8-g32 and
    # (the index query's rope) MXFP4
    plain, fp8 = dict(QDQ=-1, GROUP=32, QOUT=tl.bfloat16), dict(QDQ=0, GROUP=32, QOUT=tl.bfloat16)
    norm = {"x_ptr": bf16, "a_ptr": f32, "w_ptr": bf16, "out_ptr": bf16, "q_ptr": bf16, "eps": "fp32"}
    # rms_norm (N 0) and hc_collapse_norm (the 4 streams collapsed as they are read), each plain or fused
    for streams, raw, qdq in ((0, True, plain), (0, False, fp8), (4, True, plain), (4, True, fp8)):
        meta = dict(D=5120, N=streams, BLOCK=norm_rope.NORM_BLOCK, OUT=tl.bfloat16, RAW=raw, **qdq)
        _without_spills(norm_rope_tl.rms_norm_kernel, norm, meta)
    from dsgraph.platform.cuda.kernels import engram, engram_tl

    gate = {"x_ptr": bf16, "kv_ptr": f32, "qw_ptr": bf16, "kw_ptr": bf16, "tok_ptr": "*i32", "out_ptr": bf16}
    gate |= {"eps": "fp32", "inv_sqrt_h": "fp32", "image_token_id": "i32"}
    meta = dict(N=4, H=5120, BLOCK=engram.GATE_BLOCK, OUT=tl.bfloat16)
    _without_spills(engram_tl.engram_gate_kernel, gate, meta)
    rope = {"x_ptr": bf16, "pos_ptr": "*i32", "freq_ptr": f32, "out_ptr": bf16, "q_ptr": bf16, "heads": "i32"}
    mxfp4 = dict(QDQ=1, GROUP=32, QOUT=tl.bfloat16)
    for width, raw, qdq in ((512, True, plain), (512, False, fp8), (128, False, mxfp4)):
        meta = dict(D=width, ROPE=64, INVERSE=False, BLOCK_H=norm_rope.ROPE_BLOCK_H, BLOCK_P=32)
        meta |= dict(BLOCK_D=mhc.next_pow2(width - 64), OUT=tl.bfloat16, RAW=raw, **qdq)
        _without_spills(norm_rope_tl.rope_kernel, rope, meta)
    # rms_norm_rope: the K(=V) row (512, FP8 quantized: the SWA ring's) and the index key (128, plain)
    norm_rope_types = {"x_ptr": bf16, "w_ptr": bf16, "pos_ptr": "*i32", "freq_ptr": f32, "out_ptr": bf16}
    norm_rope_types |= {"q_ptr": bf16, "eps": "fp32", "heads": "i32"}
    for width, raw, qdq in ((512, True, fp8), (512, False, fp8), (128, True, plain)):
        meta = dict(D=width, ROPE=64, INVERSE=False, BLOCK=mhc.next_pow2(width), BLOCK_P=32)
        _without_spills(
            norm_rope_tl.norm_rope_kernel, norm_rope_types, {**meta, "OUT": tl.bfloat16, "RAW": raw, **qdq}
        )
    swiglu = {"g_ptr": bf16, "v_ptr": bf16, "out_ptr": f32, "q_ptr": bf16, "size": "i32", "limit": "fp32"}
    for raw, qdq in ((True, plain), (False, fp8)):
        meta = dict(BLOCK=moe_tl.SWIGLU_BLOCK, OUT=tl.float32, RAW=raw, **qdq)
        _without_spills(moe_tl.swiglu_kernel, swiglu, meta)
    for fmt, (group, width) in enumerate(((32, 512), (32, 128), (16, 512), (16, 512))):
        shape = dict(D=width, FMT=fmt, GROUP=group, BLOCK_G=16)
        _without_spills(
            quant_act_tl.qdq_kernel, {"x_ptr": bf16, "out_ptr": bf16}, {**shape, "OUT": tl.bfloat16}
        )
        entry = width + width // 32 if fmt == 0 else width // 2 + width // group
        _without_spills(
            quant_act_tl.encode_kernel, {"x_ptr": bf16, "out_ptr": "*u8"}, {**shape, "ENTRY": entry}
        )
    # FP8-g32 GEMM inputs held in f32 and stored in bf16 for the GEMM (the shared expert's w2 input,
    # wo_b's), and an f32 output (out_dtype same)
    for width, out in ((2048, tl.bfloat16), (8192, tl.bfloat16), (8192, tl.float32)):
        shape = dict(D=width, FMT=0, GROUP=32, BLOCK_G=16, OUT=out)
        out_ptr = bf16 if out == tl.bfloat16 else f32
        _without_spills(quant_act_tl.qdq_kernel, {"x_ptr": f32, "out_ptr": out_ptr}, shape)
    from dsgraph.platform.cuda.kernels import elementwise, elementwise_tl

    # the MoE's routed sum (f32) plus its shared expert (bf16), rounded to bf16
    add = {"a_ptr": f32, "b_ptr": bf16, "out_ptr": bf16, "size": "i32"}
    _without_spills(elementwise_tl.add_f32_kernel, add, dict(BLOCK=elementwise.BLOCK))
    from dsgraph.platform.cuda.kernels import sampling, sampling_tl

    # greedy tokens: the split argmax (with and without the bitmask) and the merge of 32 pieces
    i32 = "*i32"
    parts = {"val_ptr": f32, "idx_ptr": i32, "nan_ptr": i32, "alive_ptr": i32}
    split = {"logits_ptr": f32, "allowed_ptr": i32, **parts, "vocab": "i32", "words": "i32", "splits": "i32"}
    for mask in (False, True):
        _without_spills(sampling_tl.argmax_split_kernel, split, dict(HAS_MASK=mask, CHUNK=sampling.CHUNK), 8)
    outs = {"token_ptr": i32, "logprob_ptr": f32, "top_lp_ptr": f32, "top_ids_ptr": i32}
    merge = {**parts, **outs, "vocab": "i32", "splits": "i32", "k": "i32"}
    _without_spills(sampling_tl.argmax_merge_kernel, merge, dict(SPLITS=32, K=1), 1)


def _moe(every: bool = False) -> None:
    """V4.1's MoE at its widths: 384 experts of 2304 x 5120 (MXFP4), top-6; W4A8 with BF16 GEMM outputs.
    `every` adds the sweeps' candidate swap tiles (tools/bench/moe_sweep.py, moe_tiles.py's dequant set)."""
    import triton.language as tl

    from dsgraph.platform.cuda.kernels import linear_tl
    from dsgraph.platform.cuda.kernels import moe as rule

    ints = ("ids_ptr", "scratch_ptr", "token_ptr", "position_ptr", "tile_expert_ptr", "tile_start_ptr")
    plan = {**{name: "*i32" for name in ints}, "tile_end_ptr": "*i32", "weights_ptr": "*fp32"}
    plan |= {"route_ptr": "*fp32", "num_pairs": "i32", "num_experts": "i32", "num_tiles": "i32"}
    meta = dict(TOPK=6, BLOCK_M=rule.GATED_TILES[0], E_PAD=512, BLOCK_P=moe_tl.PLAN_BLOCK_P)
    _compile(moe_tl.plan_kernel, plan, {**meta, "BLOCK_T": moe_tl.PLAN_BLOCK_T}, moe_tl.PLAN_WARPS)
    for y in ("*bf16", "*fp32"):
        combine = {"y_ptr": y, "ids_ptr": "*i32", "position_ptr": "*i32", "out_ptr": "*fp32"}
        meta = dict(TOPK=6, BLOCK_K=8, BLOCK_H=moe_tl.COMBINE_BLOCK_H)
        _compile(moe_tl.combine_kernel, {**combine, "num_experts": "i32", "hidden": "i32"}, meta, 4)
    from dsgraph.platform.cuda.kernels import moe_route_tl

    select = {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "bias_row_stride": "i32", "weights_ptr": "*fp32"}
    select |= {"ids_ptr": "*i32", "num_experts": "i32", "routed_scaling": "fp32", "eps": "fp32"}
    _compile(moe_route_tl.route_select_kernel, select, dict(TOPK=6, BLOCK_K=8, BLOCK_E=512), 4)
    tiles = {"tile_expert_ptr": "*i32", "tile_start_ptr": "*i32", "tile_end_ptr": "*i32"}
    sizes = {"num_experts": "i32", "a_stride": "i32", "limit": "fp32"}
    for (n, k), a, gated, out in (
        ((2304, 5120), "*bf16", True, "*fp32"),
        ((5120, 2304), "*fp32", False, "*bf16"),
    ):
        gemm = {"a_ptr": a, "a_rows_ptr": "*i32", "w_ptr": "*i8", "s_ptr": "*u8", "v_ptr": "*i8"}
        gemm |= {"vs_ptr": "*u8", "route_ptr": "*fp32", **tiles, "out_ptr": out, **sizes}
        block_m, block_n, warps, _ = rule.GATED_TILES if gated else rule.DOWN_TILES
        meta = dict(N_SIZE=n, K_SIZE=k, W_ROW_LEN=k // 2, FP4=True, GATED=gated, DOT_KIND=linear_tl.DOT_FP8)
        meta |= dict(GEMM_DTYPE=tl.bfloat16, BLOCK_M=block_m, BLOCK_N=block_n, GATHER=gated)
        _compile(moe_tl.expert_gemm_kernel, gemm, meta, warps)
    buckets = [rule.SWAP_BUCKETS]
    if every:
        from dsgraph.tools.bench import moe_sweep, moe_tiles

        buckets += [b for b in moe_sweep.CANDIDATES.values() if b is not None]
        buckets += list(moe_tiles.candidates("dequant").values())
        buckets += list(moe_tiles.candidates("asm").values())
    _moe_swap(buckets)


def _moe_swap(variants: list[Any]) -> None:
    """Every tile set of the swap buckets in `variants` at V4.1's widths, without register spills."""
    import triton.language as tl

    from dsgraph.platform.cuda.kernels import moe_swap_tl

    qdq = {"x_ptr": "*bf16", "out_ptr": "*bf16", "num_rows": "i32", "width": "i32"}
    _without_spills(moe_swap_tl.qdq_rows_kernel, qdq, dict(BLOCK_R=32), 4)
    tiles = {"tile_expert_ptr": "*i32", "tile_start_ptr": "*i32", "tile_end_ptr": "*i32"}
    sizes = {"num_experts": "i32", "a_stride": "i32", "limit": "fp32"}
    aligned = {"num_experts": 384, "a_stride": 5120}  # launch values (a_stride 2304 for w2: also 16k)
    seen = set()
    for buckets in variants:
        for _, gated_tiles, down_tiles in buckets:
            for gated, t in ((True, gated_tiles), (False, down_tiles)):
                if (gated, t) in seen:
                    continue
                seen.add((gated, t))
                n, k = (2304, 5120) if gated else (5120, 2304)
                gemm = {
                    "a_ptr": "*bf16",
                    "a_rows_ptr": "*i32",
                    "w_ptr": "*i8",
                    "s_ptr": "*u8",
                    "v_ptr": "*i8",
                }
                gemm |= {"vs_ptr": "*u8", "route_ptr": "*fp32", **tiles, "out_ptr": "*bf16", **sizes}
                meta = dict(
                    N_SIZE=n, K_SIZE=k, GATED=gated, QDQ_OUT=gated, GEMM_DTYPE=tl.bfloat16, WIDE=False
                )
                meta |= dict(BLOCK_W=t.block_w, BLOCK_T=t.block_t, BLOCK_K=t.block_k)
                meta |= dict(EVEN=n % t.block_w == 0 and k % t.block_k == 0, SCALED=t.scaled, ASM=t.asm)
                meta["TOKENS"] = t.tokens
                for one in (False, True) if t.asm else (False,):  # the asm upcast's two forms
                    print(f"swap {'gated' if gated else 'down'} {t}{' one' if one else ''}", flush=True)
                    _without_spills(
                        moe_swap_tl.swap_gemm_kernel, gemm, meta | dict(ONE=one), t.num_warps, True,
                        t.num_stages, aligned,
                    )  # fmt: skip


def _linear(every: bool) -> None:
    """The linear kernels (platform/cuda/kernels/linear.py) at V4.1's widths, without register spills: for
    FP8 weights every TILE_TABLE entry on each activation path serving uses (bf16, FP8-g32 qdq'ed before
    the GEMM included, and f32 split into bf16 pieces), for dense weights every DENSE_TILE_TABLE
    entry; `every` adds the sweep's candidates (tools/bench/linear_sweep.py)."""
    from dsgraph.platform.cuda.kernels import linear as rule
    from dsgraph.platform.cuda.kernels import linear_bf16_tl as bf16
    from dsgraph.platform.cuda.kernels import linear_tl

    tiles = {t for _, t in rule.TILE_TABLE}
    if every:
        from dsgraph.tools.bench.linear_sweep import candidates

        tiles |= set(candidates())
    ints = ("m_size", "n_size", "x_stride_m", "x_stride_g", "out_stride_m", "out_stride_g", "out_size")
    sizes = {name: "i32" for name in (*ints, "s_stride")}
    pair_sizes = {name: "i32" for name in ("n2_size", "out2_size", "s2_stride")}
    aligned = {name: 1 if name == "m_size" else 16 for name in sizes}
    deq = {"w_ptr": "*fp8e4nv", "s_ptr": "*u8", "out_ptr": "*bf16", "rows_size": "i32", "k_size": "i32"}
    _without_spills(
        bf16.dequant_weight_kernel, deq | {"s_stride": "i32"}, dict(BLOCK=bf16.DEQUANT_BLOCK), 4, True
    )
    split = {"part_ptr": "*fp32", "count_ptr": "*i32"}  # K splits: partials and the tiles' arrival counts
    for t in sorted(tiles):
        modes = ((bf16.X_BF16, "*bf16"), (bf16.X_SPLIT, "*fp32"))
        for mode, x in modes:
            w = "*fp8e4nv" if t.swapped else "*bf16"
            types = {"x_ptr": x, "w_ptr": w, "s_ptr": "*u8", "out_ptr": "*bf16", **split}
            types |= {"w2_ptr": w, "s2_ptr": "*u8", "out2_ptr": "*bf16", "part2_ptr": "*fp32"}
            # K split in 4 (the shared experts' w1/w3): a program per range and the last range's sum
            # (swapped, decode), or the ranges one after the other in one program (plain, as launch picks)
            meta = dict(K_SIZE=5120, K_SPLIT=1280, W_FP8=t.swapped, X_MODE=mode, SWAPPED=t.swapped)
            meta["IN_PROGRAM"] = bf16.sums_in_program(t)
            meta |= dict(EMU_F32=False, EVEN_K=True, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k)
            meta["WIDE"] = t.wide and mode != bf16.X_SPLIT  # as linear_bf16_tl.launch sets it
            for pair in (False, True):  # one weight, or w1 and w3 in one launch (linear_pair)
                print(f"linear {t} x {x} mode {mode} pair {pair}", flush=True)
                _without_spills(
                    bf16.gemm_kernel, {**types, **sizes, **pair_sizes}, {**meta, "PAIR": pair}, t.num_warps,
                    True, t.num_stages, {**aligned, **dict.fromkeys(pair_sizes, 16)},
                )  # fmt: skip
    # a tiny model's pair: scale rows of one byte, so Triton makes both strides constexpr 1 at launch
    t = rule.TILE_TABLE[0][1]
    types = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*u8", "out_ptr": "*bf16", **split}
    types |= {"w2_ptr": "*fp8e4nv", "s2_ptr": "*u8", "out2_ptr": "*bf16", "part2_ptr": "*fp32"}
    types |= {name: "i32" for name in (*ints, "n2_size", "out2_size")}
    meta = dict(K_SIZE=64, K_SPLIT=64, W_FP8=True, X_MODE=bf16.X_BF16, SWAPPED=True, EMU_F32=False)
    meta |= dict(EVEN_K=False, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, WIDE=True)
    print(f"linear pair {t}, scale strides 1", flush=True)
    meta |= dict(IN_PROGRAM=False, PAIR=True, s_stride=1, s2_stride=1)
    _compile(bf16.gemm_kernel, types, meta, t.num_warps, True, t.num_stages)
    for t in sorted({t for _, t in rule.DENSE_TILE_TABLE}):
        types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "s_ptr": "*bf16", "out_ptr": "*fp32", **split}
        types |= {"w2_ptr": "*bf16", "out2_ptr": "*fp32", "part2_ptr": "*fp32", "n2_size": "i32"}
        types |= {"out2_size": "i32"}
        pairs = (True,) if t.block_m <= rule.PAIR_MAX_ROWS else ()  # a compressor's wkv and wgate
        for k_split, pair in ((5120, False), (1280, False), *((1280, p) for p in pairs)):
            # whole K (the head), K split in 4 (the router gate at decode), the pair (decode tiles only)
            meta = dict(K_SIZE=5120, K_SPLIT=k_split, DOT_KIND=linear_tl.DOT_NATIVE, HAS_SCALE=False)
            meta |= dict(EVEN_K=True, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, PAIR=pair)
            print(f"dense linear {t} K split {k_split} pair {pair}", flush=True)
            _without_spills(
                linear_tl.linear_kernel, {**types, **sizes}, meta, t.num_warps, True, t.num_stages, aligned
            )


def main(argv: list[str]) -> int:
    if argv[1:] == ["linear"]:
        _linear(every=True)
        return 0
    if argv[1:] == ["select"]:
        _select()
        return 0
    if argv[1:] == ["moe"]:
        _moe(every=True)
        return 0
    if argv[1:2] == ["attention"]:  # attn_sweep's tilings (or those named), bf16 queries
        from dsgraph.tools.bench.attn_sweep import tilings

        names = argv[2:] or list(tilings())
        _attention(512, "bf16", {name: tilings()[name] for name in names})
        return 0
    head_dim = int(argv[1]) if len(argv) > 1 else 512  # the real width: shared-memory limits show there
    for dtype in ("bf16", "fp32"):
        _attention(head_dim, dtype)
        _indexer(dtype)
    _select()
    _cache()
    _fused()
    _moe()
    _linear(every=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
