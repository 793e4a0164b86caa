"""Triton kernels of `attention` (dsgraph.ops.attention): SWA keys from this chunk's kv rows or the FP8-g32
ring, then the selected NVFP4-g16 entries of the paged pool, softmax with the sink, V = K.

Canonical order (the source of batch invariance): a row's keys are its `window` SWA slots (oldest first)
cut into SWA_TILES tiles of BLOCK_N keys, then its `topk` slots cut the same way. The SWA tiles form the
first splits and the pool tiles the next, SPLIT_TILES tiles a split (the last SWA split and the last
pool split may hold fewer). The counts are fixed by the rule module's tiles and the op's params, never
chosen from the batch. Each split runs an online softmax over its tiles from a
fresh state (m: running max in log2 units, lsum: sum of exp2, acc: exp2-weighted keys); the splits are
merged in ascending order and the sink joins last. The decode path writes every split's state to memory
(grid rows x head blocks x 2 halves x splits) and `merge_kernel` merges them; the prefill path
(`fused_kernel`, grid rows x head blocks x 2 halves) runs the same helpers for every split in one
program and merges in registers. Same arithmetic in the same order: a row's result depends on neither
batch nor path.

Columns are handled as two halves, even and odd (c = 0 .. HEAD_DIM/2): a packed NVFP4 byte c holds key
columns 2c (low nibble) and 2c+1 (high nibble), so a tile is decoded straight from one contiguous byte
load without interleaving registers, and q.k = q_even.k_even + q_odd.k_odd. A program owns one half of
the output columns (grid axis 1 = head block x 2): it computes the full scores (both halves, in the same
order in both programs, so both see the same m and lsum bits) and one P.V dot into a [BLOCK_H, HEAD_DIM/2]
f32 accumulator; keeping both halves in one program spills registers at 512 columns. A key tile is decoded
once per program for all BLOCK_H heads (the M side of both dots). Decoding is exact: E4M3 bytes times the
UE8M0 power of two, and E2M1 codes read as f16 bit patterns (value / 2^14) times the E4M3 scale times
2^14; scale bytes are loaded once per group and widened in registers. bf16/f16 queries meet bf16/f16 keys
in tl.dot (exact products, f32 accumulation); f32 queries use IEEE f32 dots (never TF32). Probabilities
enter the P.V dot in the query dtype. Softmax runs in log2 units (exp2, scale times log2 e).

Loop trip counts are constexpr (SWA_TILES, SPLIT_TILES, NUM_SPLITS) with a guard per tile: Triton 3.6's
interpreter cannot loop over a runtime bound with numpy 2 (it turns the bound into a 1-element array).
Importing this module imports triton; attention.py imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsgraph.platform.cuda.kernels import pdl_tl
from dsgraph.platform.cuda.kernels.quant_tl import E2M1_PAIRS_ASM, bf16_halves, e8m0_to_f32

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def e2m1_to_f32(code: tl.tensor) -> tl.tensor:
    """4-bit E2M1 code (bit 3 = sign, code 8 = -0) -> f32: 0, .5, 1, 1.5, 2, 3, 4, 6 from the bits."""
    code = code.to(tl.int32)
    magnitude = code & 7
    exponent = magnitude >> 1
    mantissa = magnitude & 1
    normal = ((exponent + 126) << 23) | (mantissa << 22)
    bits = tl.where(exponent == 0, mantissa * 0x3F000000, normal)
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_scaled(code: tl.tensor, scale: tl.tensor) -> tl.tensor:
    """E2M1 codes (int32 0..15) times `scale` (f32, already times 2^14). The f16 with bits sign << 15 |
    magnitude << 9 is exactly code / 2^14 for every code (the subnormal 0.5 included): two ALU ops."""
    half = (((code & 8) << 12) | ((code & 7) << 9)).to(tl.int16).to(tl.float16, bitcast=True)
    return half.to(tl.float32) * scale


@triton.jit
def e4m3_to_f32(byte: tl.tensor) -> tl.tensor:
    return byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def bf16_pair(byte: tl.tensor) -> tl.tensor:
    """E4M3 bytes -> int32 words holding the value as BF16 twice (exact: BF16 holds every E4M3 value)."""
    half = e4m3_to_f32(byte).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return half * 0x10001


@triton.jit
def e2m1_bf16_pairs(packed: tl.tensor, scale: tl.tensor) -> tuple[tl.tensor, tl.tensor]:
    """Packed E2M1 bytes and each byte's E4M3 scale as bf16_pair -> (low nibbles, high nibbles) as BF16 values
    times the scale, exactly (a code has 2 significant bits and a scale 4: the product fits BF16's 8, and
    E4M3's range sits inside BF16's), through quant_tl's PTX, which gives each byte a BF16x2 register.
    Not pure, so the compiler decodes a tile once and moves the values to each dot's layout: as pure, it
    recomputed the whole decode in the scores' operand layout and again in the P.V one (sm_90 SASS of the
    split kernel's pool loop: 2,879 instructions a tile pure, 2,138 not)."""
    words = tl.inline_asm_elementwise(
        E2M1_PAIRS_ASM, "=r,=r,=r,=r,r,r,r,r,r", [packed, scale], dtype=tl.int32, is_pure=False, pack=4
    )
    return bf16_halves(words)


@triton.jit
def low_dot(a, b, DOT: tl.constexpr):
    """a @ b with f32 accumulation. DOT 0: IEEE f32 operands; 1: a and b already in bf16/f16 (3: bf16, the
    pool's keys decoded by PTX, e2m1_bf16_pairs); 2: the same values widened to f32 (the interpreter
    computes bf16 dots wrongly; products of bf16 values are exact in f32, so only the order of the sum
    differs from the GPU)."""
    if DOT == 1 or DOT == 3:
        return tl.dot(a, b)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def low_dot_acc(a, b, acc, DOT: tl.constexpr):
    """acc + a @ b, as low_dot."""
    if DOT == 1 or DOT == 3:
        return tl.dot(a, b, acc)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def online_update(q_e, q_o, k_e, k_o, valid, parity, m, lsum, acc, scale_log2, DOT: tl.constexpr):
    """Fold one tile (key halves k_e, k_o [BLOCK_N, BLOCK_C] f32, valid [BLOCK_N]) into the state of the
    program's half of the columns (`parity`: 0 even, 1 odd): both halves give the scores, one the P.V."""
    k_e = k_e.to(q_e.dtype)
    k_o = k_o.to(q_o.dtype)
    s = low_dot_acc(q_o, tl.trans(k_o), low_dot(q_e, tl.trans(k_e), DOT), DOT)
    s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_use)
    p = tl.exp2(s - m_use[:, None])
    lsum = lsum * alpha + tl.sum(p, axis=1)
    acc = low_dot_acc(p.to(q_e.dtype), tl.where(parity == 0, k_e, k_o), acc * alpha[:, None], DOT)
    return m_new, lsum, acc


@triton.jit
def merge_weights(m, m_s):
    """(new max, weight of the running state, weight of the split's state) in log2 units."""
    m_new = tl.maximum(m, m_s)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, tl.exp2(m - m_use), tl.exp2(m_s - m_use)


@triton.jit
def finish(m, lsum, acc, sink_log2):
    """out = acc / (lsum + 2^sink), all relative to max(m, sink) (log2 units)."""
    top = tl.maximum(m, sink_log2)
    a = tl.exp2(m - top)
    denominator = lsum * a + tl.exp2(sink_log2 - top)
    return acc * (a / denominator)[:, None]


@triton.jit
def group_bytes(at, rows, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, GROUPS: tl.constexpr,
                SPAN: tl.constexpr):  # fmt: skip
    """Scale bytes at[n, g] (g < GROUPS) of the BLOCK_C // SPAN groups of a tile -> [BLOCK_N, BLOCK_C //
    SPAN] (0 past the last group or where not `rows`): one load per group."""
    g = tl.arange(0, BLOCK_C // SPAN)
    return tl.load(at + g[None, :], mask=rows[:, None] & (g < GROUPS)[None, :], other=0)


@triton.jit
def spread(x, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, SPAN: tl.constexpr):
    """[BLOCK_N, BLOCK_C // SPAN] group values -> [BLOCK_N, BLOCK_C], each over its SPAN half-columns (a 3-d
    broadcast and reshape: widened in registers)."""
    G: tl.constexpr = BLOCK_C // SPAN
    return tl.reshape(tl.broadcast_to(x[:, :, None], (BLOCK_N, G, SPAN)), (BLOCK_N, BLOCK_C))


@triton.jit
def group_scales(at, rows, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, GROUPS: tl.constexpr,
                 SPAN: tl.constexpr):  # fmt: skip
    """group_bytes spread over their half-columns c = g*SPAN .. (g+1)*SPAN - 1: [BLOCK_N, BLOCK_C] bytes."""
    return spread(group_bytes(at, rows, BLOCK_N, BLOCK_C, GROUPS, SPAN), BLOCK_N, BLOCK_C, SPAN)


@triton.jit
def load_pairs(at, mask):
    """(*at, *(at + 1)) where `mask`, else 0: the even and the odd half-column, two loads of stride 2."""
    return tl.load(at, mask=mask, other=0), tl.load(at + 1, mask=mask, other=0)


@triton.jit
def swa_tile(
    kv_ptr, ring_ptr, tile, t, p, start, first, slot, real, c, cmask, num_rows, ring_len,
    WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """SWA keys j = tile*BLOCK_N .. of row t (position p - window + 1 + j): this chunk's kv row t - (p - pos)
    when pos >= seq_start, else ring[slot, pos % R]: (even half, odd half [BLOCK_N, BLOCK_C] f32, valid);
    keys that are not valid are zero."""
    j = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    pos = p - (WINDOW - 1) + j
    valid = real & (j < WINDOW) & (pos >= 0) & (pos >= first)
    in_chunk = pos >= start
    # Clamped so that a step the eager checks would refuse still reads inside the buffers.
    chunk_row = tl.minimum(tl.maximum(t - (WINDOW - 1) + j, 0), num_rows - 1).to(tl.int64)
    mask = (valid & in_chunk)[:, None] & cmask[None, :]
    even, odd = load_pairs(kv_ptr + chunk_row[:, None] * HEAD_DIM + 2 * c[None, :], mask)
    even, odd = even.to(tl.float32), odd.to(tl.float32)
    ring_row = slot.to(tl.int64) * ring_len + tl.maximum(pos, 0) % ring_len
    from_ring = valid & (pos < start)
    mask = from_ring[:, None] & cmask[None, :]
    entry = ring_ptr + (ring_row * (HEAD_DIM + HEAD_DIM // 32))[:, None]
    scale = e8m0_to_f32(group_scales(entry + HEAD_DIM, from_ring, BLOCK_N, BLOCK_C, HEAD_DIM // 32, 16))
    ring_even, ring_odd = load_pairs(entry + 2 * c[None, :], mask)
    ring_even, ring_odd = e4m3_to_f32(ring_even) * scale, e4m3_to_f32(ring_odd) * scale
    pick = in_chunk[:, None]
    return tl.where(pick, even, ring_even), tl.where(pick, odd, ring_odd), valid


@triton.jit
def entry_rows(table_ptr, topk_ptr, t, s, j, real, topk_width, block_size, table_width, num_blocks):
    """(valid, pool row) of the entries g = topk[t, j] of sequence s: table[s, g // bs] * bs + g % bs."""
    g = tl.load(topk_ptr + t.to(tl.int64) * topk_width + j, mask=real & (j < topk_width), other=-1)
    column = tl.maximum(g, 0) // block_size  # one division: the offset in the block follows from it
    inside = (g >= 0) & (column < table_width)
    block = tl.load(table_ptr + s.to(tl.int64) * table_width + column, mask=inside, other=-1)
    valid = inside & (block >= 0) & (block < num_blocks)
    return valid, block * block_size + (g - column * block_size)


@triton.jit
def pool_tile(
    pool_ptr, table_ptr, topk_ptr, tile, t, s, real, c, cmask, topk_width, block_size, table_width,
    num_blocks, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """Selected entries g = topk[t, j] (j = tile*BLOCK_N ..) decoded from pool[table[s, g // bs], g % bs]:
    (even half, odd half [BLOCK_N, BLOCK_C] f32, valid [BLOCK_N]); absent (-1) or unplaceable entries
    are not keys (and read as zero)."""
    j = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    valid, row = entry_rows(
        table_ptr, topk_ptr, t, s, j, real, topk_width, block_size, table_width, num_blocks
    )
    row = tl.where(valid, row, 0).to(tl.int64)
    entry = pool_ptr + (row * (HEAD_DIM // 2 + HEAD_DIM // 16))[:, None]
    mask = valid[:, None] & cmask[None, :]
    packed = tl.load(entry + c[None, :], mask=mask, other=0)
    scale = group_bytes(entry + HEAD_DIM // 2, valid, BLOCK_N, BLOCK_C, HEAD_DIM // 16, 8)
    if ASM:
        k_e, k_o = e2m1_bf16_pairs(packed, spread(bf16_pair(scale), BLOCK_N, BLOCK_C, 8))
    else:
        scale = spread(scale, BLOCK_N, BLOCK_C, 8)
        packed = packed.to(tl.int32)
        scale = e4m3_to_f32(scale) * 16384.0
        k_e, k_o = e2m1_scaled(packed & 15, scale), e2m1_scaled(packed >> 4, scale)
    return k_e, k_o, valid


@triton.jit
def load_q(q_ptr, t, hb, num_heads, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """Heads hb*BLOCK_H .. of row t: (heads, head mask, half-columns c, their mask, q even, q odd)."""
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, BLOCK_C)
    hmask = h < num_heads
    if HEAD_DIM // 2 == BLOCK_C:  # a constant mask: the compiler then vectorizes loads along c
        cmask = tl.full([BLOCK_C], 1, tl.int1)
    else:
        cmask = c < HEAD_DIM // 2
    at = q_ptr + ((t.to(tl.int64) * num_heads + h) * HEAD_DIM)[:, None] + 2 * c[None, :]
    mask = hmask[:, None] & cmask[None, :]
    return h, hmask, c, cmask, tl.load(at, mask=mask, other=0.0), tl.load(at + 1, mask=mask, other=0.0)


@triton.jit
def split_state(
    q_e, q_o, c, cmask, parity, split, t,
    kv_ptr, ring_ptr, pool_ptr, pos_ptr, seq_ptr, slot_ptr, start_ptr, first_ptr, table_ptr, topk_ptr,
    num_rows, ring_len, num_blocks, block_size, table_width, topk_width, scale_log2,
    WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT_TILES: tl.constexpr, HAS_POOL: tl.constexpr, DOT: tl.constexpr,
    DRAFT: tl.constexpr = 0,
):  # fmt: skip
    """Online-softmax state (m, lsum, acc of the `parity` half) of row t's heads over one split, fresh:
    splits 0 .. SWA_SPLITS - 1 hold the SWA tiles split*SPLIT_TILES .., then split SWA_SPLITS + i the
    pool tiles i*SPLIT_TILES .. (i+1)*SPLIT_TILES - 1. DRAFT > 0 (`draft_attention`: blocks of DRAFT
    rows at positions seq_start ..): every row of a block takes the keys of the block's last row, whose
    window (WINDOW = the op's window + DRAFT) is the context before seq_start plus the whole block."""
    seq = tl.load(seq_ptr + t)
    real = seq >= 0
    s = tl.maximum(seq, 0)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    SWA_TILES: tl.constexpr = (WINDOW + BLOCK_N - 1) // BLOCK_N
    SWA_SPLITS: tl.constexpr = (SWA_TILES + SPLIT_TILES - 1) // SPLIT_TILES
    if split < SWA_SPLITS:
        p = tl.load(pos_ptr + t)
        slot = tl.load(slot_ptr + s, mask=real, other=0)
        start = tl.load(start_ptr + s, mask=real, other=0)
        first = tl.load(first_ptr + s, mask=real, other=0)
        key_t = t
        if DRAFT > 0:  # the block's last row: row t sits at position p, DRAFT - 1 - (p - start) before it
            key_t = t + (DRAFT - 1) - (p - start)
            p = start + (DRAFT - 1)
        for i in range(SPLIT_TILES):
            tile = split * SPLIT_TILES + i
            if tile < SWA_TILES:  # uniform: the last SWA split may hold fewer tiles
                k_e, k_o, valid = swa_tile(
                    kv_ptr, ring_ptr, tile, key_t, p, start, first, slot, real, c, cmask, num_rows,
                    ring_len, WINDOW, HEAD_DIM, BLOCK_N, BLOCK_C,
                )  # fmt: skip
                m, lsum, acc = online_update(q_e, q_o, k_e, k_o, valid, parity, m, lsum, acc, scale_log2, DOT)
    elif HAS_POOL:
        for i in range(SPLIT_TILES):
            tile = (split - SWA_SPLITS) * SPLIT_TILES + i
            if tile * BLOCK_N < topk_width:  # uniform: the last split may hold fewer tiles
                k_e, k_o, valid = pool_tile(
                    pool_ptr, table_ptr, topk_ptr, tile, t, s, real, c, cmask, topk_width, block_size,
                    table_width, num_blocks, HEAD_DIM, BLOCK_N, BLOCK_C, DOT == 3,
                )  # fmt: skip
                m, lsum, acc = online_update(q_e, q_o, k_e, k_o, valid, parity, m, lsum, acc, scale_log2, DOT)
    return m, lsum, acc


@triton.jit
def split_kernel(
    q_ptr, kv_ptr, ring_ptr, pool_ptr,
    pos_ptr, seq_ptr, slot_ptr, start_ptr, first_ptr, table_ptr, topk_ptr,
    m_ptr, l_ptr, acc_ptr,
    num_rows, num_heads, ring_len, num_blocks, block_size: tl.constexpr, table_width, topk_width, scale_log2,
    NUM_SPLITS: tl.constexpr, WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_TILES: tl.constexpr, HAS_POOL: tl.constexpr,
    DOT: tl.constexpr, DRAFT: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """Decode path, grid (rows, head blocks x 2 halves, splits): a split's m, lsum [T, splits, H] (from the
    even program; the odd one computes the same bits) and acc [.., D] (even half, then odd half)."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    split = tl.program_id(2)
    parity = tl.program_id(1) % 2
    h, hmask, c, cmask, q_e, q_o = load_q(q_ptr, t, tl.program_id(1) // 2, num_heads, HEAD_DIM, BLOCK_H,
                                          BLOCK_C)  # fmt: skip
    m, lsum, acc = split_state(
        q_e, q_o, c, cmask, parity, split, t,
        kv_ptr, ring_ptr, pool_ptr, pos_ptr, seq_ptr, slot_ptr, start_ptr, first_ptr, table_ptr, topk_ptr,
        num_rows, ring_len, num_blocks, block_size, table_width, topk_width, scale_log2,
        WINDOW, HEAD_DIM, BLOCK_H, BLOCK_C, BLOCK_N, SPLIT_TILES, HAS_POOL, DOT, DRAFT,
    )  # fmt: skip
    state = (t.to(tl.int64) * NUM_SPLITS + split) * num_heads + h
    tl.store(m_ptr + state, m, mask=hmask & (parity == 0))
    tl.store(l_ptr + state, lsum, mask=hmask & (parity == 0))
    at = acc_ptr + (state * HEAD_DIM + parity * (HEAD_DIM // 2))[:, None] + c[None, :]
    tl.store(at, acc, mask=hmask[:, None] & cmask[None, :])


@triton.jit
def store_out(out_ptr, t, h, hmask, c, cmask, parity, m, lsum, acc, sink_ptr, num_heads,
              HEAD_DIM: tl.constexpr):  # fmt: skip
    """Join the sink, divide, write the `parity` columns (2c + parity) of row t's heads h."""
    sink = tl.load(sink_ptr + h, mask=hmask, other=0.0) * LOG2E
    at = out_ptr + ((t.to(tl.int64) * num_heads + h) * HEAD_DIM)[:, None] + 2 * c[None, :] + parity
    out = finish(m, lsum, acc, sink).to(out_ptr.dtype.element_ty)
    tl.store(at, out, mask=hmask[:, None] & cmask[None, :])


@triton.jit
def merge_kernel(
    m_ptr, l_ptr, acc_ptr, sink_ptr, out_ptr, num_heads,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Decode path, grid (rows, head blocks): merge the splits in ascending order, then the sink."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, BLOCK_C)
    hmask = h < num_heads
    cmask = c < HEAD_DIM // 2
    mask = hmask[:, None] & cmask[None, :]
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc_e = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    acc_o = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for split in range(NUM_SPLITS):
        state = (t.to(tl.int64) * NUM_SPLITS + split) * num_heads + h
        m_s = tl.load(m_ptr + state, mask=hmask, other=float("-inf"))
        l_s = tl.load(l_ptr + state, mask=hmask, other=0.0)
        at = acc_ptr + (state * HEAD_DIM)[:, None] + c[None, :]
        acc_se = tl.load(at, mask=mask, other=0.0)
        acc_so = tl.load(at + HEAD_DIM // 2, mask=mask, other=0.0)
        m, a, b = merge_weights(m, m_s)
        lsum = lsum * a + l_s * b
        acc_e = acc_e * a[:, None] + acc_se * b[:, None]
        acc_o = acc_o * a[:, None] + acc_so * b[:, None]
    store_out(out_ptr, t, h, hmask, c, cmask, 0, m, lsum, acc_e, sink_ptr, num_heads, HEAD_DIM)
    store_out(out_ptr, t, h, hmask, c, cmask, 1, m, lsum, acc_o, sink_ptr, num_heads, HEAD_DIM)


@triton.jit
def fused_kernel(
    q_ptr, kv_ptr, ring_ptr, pool_ptr, sink_ptr,
    pos_ptr, seq_ptr, slot_ptr, start_ptr, first_ptr, table_ptr, topk_ptr,
    out_ptr,
    num_rows, num_heads, ring_len, num_blocks, block_size: tl.constexpr, table_width, topk_width, scale_log2,
    NUM_SPLITS: tl.constexpr, WINDOW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_TILES: tl.constexpr, HAS_POOL: tl.constexpr,
    DOT: tl.constexpr, DRAFT: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """Prefill path, grid (rows, head blocks x 2 halves): every split of the row in one program, merged
    as it goes."""
    pdl_tl.enter(PDL)
    t = tl.program_id(0)
    parity = tl.program_id(1) % 2
    h, hmask, c, cmask, q_e, q_o = load_q(q_ptr, t, tl.program_id(1) // 2, num_heads, HEAD_DIM, BLOCK_H,
                                          BLOCK_C)  # fmt: skip
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for split in range(NUM_SPLITS):
        m_s, l_s, acc_s = split_state(
            q_e, q_o, c, cmask, parity, split, t,
            kv_ptr, ring_ptr, pool_ptr, pos_ptr, seq_ptr, slot_ptr, start_ptr, first_ptr, table_ptr,
            topk_ptr, num_rows, ring_len, num_blocks, block_size, table_width, topk_width, scale_log2,
            WINDOW, HEAD_DIM, BLOCK_H, BLOCK_C, BLOCK_N, SPLIT_TILES, HAS_POOL, DOT, DRAFT,
        )  # fmt: skip
        m, a, b = merge_weights(m, m_s)
        lsum = lsum * a + l_s * b
        acc = acc * a[:, None] + acc_s * b[:, None]
    store_out(out_ptr, t, h, hmask, c, cmask, parity, m, lsum, acc, sink_ptr, num_heads, HEAD_DIM)
