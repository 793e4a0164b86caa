"""Activation quantize->dequantize boundaries and cache entry codecs (spec model-v41 3.3, 6).

Formats (groups of consecutive channels along the last dim):
- `fp8_g32`: E4M3 values, one UE8M0 (power-of-two) scale per 32 (SWA KV; DeepInfer's activation cast);
- `mxfp4_g32`: E2M1 values, one UE8M0 scale per 32 (index queries and keys);
- `nvfp4_g16`: E2M1 values, one E4M3 scale per 16, value = E2M1(x / scale) (NeMo, the oracle);
- `nvfp4_g16_recip`: the same bytes, value = E2M1(x * fl32(1 / scale)) (DeepInfer's kernel; differs from
  `nvfp4_g16` only at exact rounding ties, numerics-nemo-vs-deepinfer 2c);
- `f32`: no rounding, the four little-endian bytes of each f32 value (caches of a model whose reference
  keeps them unquantized: DeepSeek-V4 as transformers computes it).
"""

from __future__ import annotations

from dsgraph.graph.op import ShapeError, declare_op, params
from dsgraph.graph.types import Dim, TensorType
from dsgraph.ops import rules as R

# fmt -> channels per scale
GROUP_SIZES: dict[str, int] = {
    "fp8_g32": 32,
    "mxfp4_g32": 32,
    "nvfp4_g16": 16,
    "nvfp4_g16_recip": 16,
    "f32": 1,
}
FORMATS = tuple(GROUP_SIZES)
ACTIVATION_DTYPES = ("f32", "bf16", "f16")

__all__ = ["FORMATS", "GROUP_SIZES", "SAME_DTYPE", "act_qdq", "cache_decode", "cache_encode", "entry_bytes"]


def entry_bytes(fmt: str, width: int) -> int:
    """Bytes of one cache entry of `width` channels.

    528 for fp8_g32 at 512, 288 for nvfp4_g16 at 512, 68 for mxfp4_g32 at 128.
    """
    check_width(fmt, width, "width")
    if fmt == "f32":
        return 4 * width
    if fmt == "fp8_g32":
        return width + width // 32  # one E4M3 byte per value, one UE8M0 byte per group
    if fmt == "mxfp4_g32":
        return width // 2 + width // 32  # two E2M1 codes per byte, one UE8M0 byte per group
    return width // 2 + width // 16  # nvfp4: two codes per byte, one E4M3 scale byte per group


def check_width(fmt: str, width: Dim, what: str) -> int:
    """`width` as an int that is a positive multiple of `fmt`'s group; ShapeError naming `what` otherwise."""
    if fmt not in GROUP_SIZES:
        raise ShapeError(f"fmt {fmt!r} is not one of {list(FORMATS)}")
    group = GROUP_SIZES[fmt]
    if not isinstance(width, int) or width <= 0 or width % group:
        raise ShapeError(f"{what} is {width}, expected a positive multiple of {group} (the {fmt} group size)")
    return width


def _require_activation(x: TensorType, fmt: str, what: str) -> int:
    R.require_dtype(x, ACTIVATION_DTYPES, what)
    if x.rank < 1:
        raise ShapeError(f"{what} must have rank >= 1, got {x}")
    return check_width(fmt, x.shape[-1], f"last dim of {what} {x}")


@params
class QdqParams:
    fmt: str


SAME_DTYPE = "same"  # act_qdq's out_dtype that keeps x's dtype


@params
class ActQdqParams:
    fmt: str
    # The dtype the dequantized values are stored in. A GEMM input quantized once for several linears is
    # stored in bf16: FP8 and FP4 values times power-of-two scales are exact there, so the GEMMs read the
    # same values as from f32, at half the bytes (and as one bf16 dot operand on cuda).
    out_dtype: str = SAME_DTYPE


def _act_qdq_rule(p: ActQdqParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    _require_activation(ts[0], p.fmt, "x")
    if p.out_dtype == SAME_DTYPE:
        return (ts[0],)
    if p.out_dtype not in ACTIVATION_DTYPES:
        raise ShapeError(
            f"act_qdq out_dtype is {p.out_dtype!r}, expected one of {[SAME_DTYPE, *ACTIVATION_DTYPES]}"
        )
    return (ts[0].with_dtype(p.out_dtype),)


act_qdq = declare_op(
    "act_qdq",
    ActQdqParams,
    _act_qdq_rule,
    "`x [*, d] f32|bf16|f16` -> `[*, d]` out_dtype (same: x's dtype): quantize then dequantize x in groups "
    "along d (fmt in fp8_g32, mxfp4_g32, nvfp4_g16, nvfp4_g16_recip; d a multiple of the group), computed "
    "in f32, cast once to out_dtype; fmt f32 only casts through f32. A linear whose x is this op's output "
    "takes act_quant none: it must not quantize again.",
    num_inputs=1,
)


def _cache_encode_rule(p: QdqParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    width = _require_activation(ts[0], p.fmt, "x")
    return (TensorType((*ts[0].shape[:-1], entry_bytes(p.fmt, width)), "u8"),)


cache_encode = declare_op(
    "cache_encode",
    QdqParams,
    _cache_encode_rule,
    "`x [*, d] f32|bf16|f16` -> `[*, entry_bytes(fmt, d)] u8`: one packed cache entry per row "
    "(fp8_g32: d E4M3 bytes then d/32 UE8M0; mxfp4_g32: d/2 E2M1 bytes, low nibble = even channel, then d/32 "
    "UE8M0; nvfp4_g16[_recip]: d/2 E2M1 bytes then d/16 E4M3 scales; f32: 4d bytes, the f32 values). "
    "decode(encode(x)) == act_qdq(x).",
    num_inputs=1,
)


@params
class CacheDecodeParams:
    fmt: str
    width: int
    dtype: str = "f32"


def _cache_decode_rule(p: CacheDecodeParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    (e,) = ts
    R.require_dtype(e, ("u8",), "entries")
    if e.rank < 1:
        raise ShapeError(f"entries must have rank >= 1, got {e}")
    want = entry_bytes(p.fmt, check_width(p.fmt, p.width, "param width"))
    R.require_dim(e.shape[-1], want, f"entry bytes of entries {e} for {p.fmt} width {p.width}")
    if p.dtype not in ACTIVATION_DTYPES:
        raise ShapeError(f"param dtype is {p.dtype!r}, expected one of {list(ACTIVATION_DTYPES)}")
    return (TensorType((*e.shape[:-1], p.width), p.dtype),)


cache_decode = declare_op(
    "cache_decode",
    CacheDecodeParams,
    _cache_decode_rule,
    "`entries [*, entry_bytes(fmt, width)] u8` -> `[*, width] dtype`: the dequantized values of cache "
    "entries "
    "written by cache_encode (nvfp4_g16 and nvfp4_g16_recip entries decode the same way).",
    num_inputs=1,
)
