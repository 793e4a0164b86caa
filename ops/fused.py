"""Fused ops: two equations of the model as one, so a platform can run them in one kernel. Models never
emit them: a platform's lowering rewrites the pairs (platform/fusion.py, on for the cuda platform).
Each computes exactly what its two equations compute, every intermediate rounded as they round it.

- `<op>_qdq` (rms_norm, rope, swiglu, hc_collapse_norm, rms_norm_rope): the op and the `act_qdq` of its
  output. Outputs `(y, q)`, or `(q,)` when `raw` is False (y has no other reader), where y is the op's
  output and q = act_qdq(y, fmt=qdq_fmt, out_dtype=qdq_dtype), which reads y as stored (rounded to y's
  dtype).
- `hc_expand_pre`: hc_expand, then hc_pre of the streams it wrote (the next sublayer's coefficients).
- `hc_collapse_norm`: hc_collapse, then rms_norm of the collapsed row (a sublayer's input).
- `linear_pair`: two linears of one activation with the same params (block-scaled weights), e.g. the
  shared expert's w1 and w3, or the attention's wq_a and wkv.
- `rms_norm_rope` (and its `_qdq`): rms_norm of the last dim, then rope of the normalized rows (a K(=V)
  row or an index key: the norm is their only reader).
- `encode_swa_write`, `encode_paged_write`: cache_encode of values, then the cache write of its entries.
- `compress_norm`: compress (ops/cache.py), then rms_norm of its latent (the compressor's norm, its
  latent's only reader); closes and the state come out as compress gives them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dsgraph.graph.op import NoParams, OpDef, declare_op, get_op, params
from dsgraph.graph.types import TensorType
from dsgraph.ops import cache, mhc, moe, nn, rope
from dsgraph.ops.quant import SAME_DTYPE, ActQdqParams, QdqParams

__all__ = ["FUSED_QDQ", "compress_params", "inner_params", "qdq_params", "rope_params"]


def _expand_pre_rule(p: mhc.HcPreParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    (x,) = get_op("hc_expand").infer(NoParams(), ts[:4])
    return (x, *get_op("hc_pre").infer(p, (x, *ts[4:])))


declare_op(
    "hc_expand_pre",
    mhc.HcPreParams,
    _expand_pre_rule,
    "`y [tokens, H], x [tokens, n, H], post [tokens, n] f32, comb [tokens, n, n] f32, fn, base, scale` -> "
    "`(x' [tokens, n, H], pre, post', comb')`: x' = hc_expand(y, x, post, comb), then (pre, post', comb') = "
    "hc_pre(x', fn, base, scale) (ops/mhc.py).",
    num_inputs=7,
)


@params
class HcCollapseNormParams:
    eps: float
    out_dtype: str = "f32"  # the collapsed row's dtype, and so the norm's


def _collapse_norm_rule(p: HcCollapseNormParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    (c,) = get_op("hc_collapse").infer(mhc.HcCollapseParams(out_dtype=p.out_dtype), ts[:2])
    return get_op("rms_norm").infer(nn.RMSNormParams(eps=p.eps), (c, ts[2]))


declare_op(
    "hc_collapse_norm",
    HcCollapseNormParams,
    _collapse_norm_rule,
    "`x [tokens, n, H] float, a [tokens, n] f32, weight [H] float` -> `[tokens, H] out_dtype`: "
    "rms_norm(hc_collapse(x, a) in out_dtype, weight) (ops/mhc.py, ops/nn.py).",
    num_inputs=3,
)


@params
class RMSNormRopeParams(rope.RopeParams):
    eps: float = dataclasses.field(kw_only=True)  # the norm's; the rest are the rope's


def params_as(cls: type, p: Any) -> Any:
    """The fields of `cls` that a fused op's params `p` extend, as a `cls`."""
    return cls(**{f.name: getattr(p, f.name) for f in dataclasses.fields(cls)})


def rope_params(p: RMSNormRopeParams) -> rope.RopeParams:
    """The rope's own params inside an `rms_norm_rope` op's."""
    return params_as(rope.RopeParams, p)


def _norm_rope_rule(p: RMSNormRopeParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    (y,) = get_op("rms_norm").infer(nn.RMSNormParams(eps=p.eps), ts[:2])
    return get_op("rope").infer(rope_params(p), (y, ts[2]))


declare_op(
    "rms_norm_rope",
    RMSNormRopeParams,
    _norm_rope_rule,
    "`x [*, D] float, weight [D] float, positions [tokens] i32` -> `[*, D]` x's dtype: "
    "rope(rms_norm(x, weight) rounded to x's dtype, positions) (ops/nn.py, ops/rope.py).",
    num_inputs=3,
)


@params
class CompressNormParams:
    ratio: int
    eps: float  # the norm's
    out_dtype: str = "f32"  # of the latent, and so of the norm's output


def compress_params(p: CompressNormParams) -> cache.CompressParams:
    """The compress's own params inside a `compress_norm` op's."""
    return params_as(cache.CompressParams, p)


def _compress_norm_rule(p: CompressNormParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    outs = get_op("compress").infer(compress_params(p), ts[:-1])
    (y,) = get_op("rms_norm").infer(nn.RMSNormParams(eps=p.eps), (outs[0], ts[-1]))
    return (y, *outs[1:])


declare_op(
    "compress_norm",
    CompressNormParams,
    _compress_norm_rule,
    "compress's operands (ratio 1 or 2), then `weight [D] float` -> compress's outputs with the latent "
    "replaced by rms_norm(latent, weight) (the latent rounded to out_dtype first, as compress stores it).",
)


def _linear_pair_rule(p: nn.LinearParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    x, w1, s1, w2, s2 = ts
    linear = get_op("linear")
    return (*linear.infer(p, (x, w1, s1)), *linear.infer(p, (x, w2, s2)))


declare_op(
    "linear_pair",
    nn.LinearParams,
    _linear_pair_rule,
    "`x [*, k] float, w1, scale1, w2, scale2` (two block-scaled weights) -> `(y1 [*, rows1], y2 [*, rows2])` "
    "out_dtype: linear(x, w1, scale1), linear(x, w2, scale2) with the same params (ops/nn.py).",
    num_inputs=5,
)


@params
class RMSNormQdqParams(nn.RMSNormParams):
    qdq_fmt: str = "fp8_g32"
    qdq_dtype: str = SAME_DTYPE
    raw: bool = True


@params
class RopeQdqParams(rope.RopeParams):
    qdq_fmt: str = "fp8_g32"
    qdq_dtype: str = SAME_DTYPE
    raw: bool = True


@params
class SwigluQdqParams(moe.SwigluParams):
    qdq_fmt: str = "fp8_g32"
    qdq_dtype: str = SAME_DTYPE
    raw: bool = True


def _encode_write_rule(write: str) -> Any:
    def rule(p: QdqParams, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
        (entries,) = get_op("cache_encode").infer(p, ts[1:2])
        return get_op(write).infer(NoParams(), (ts[0], entries, *ts[2:]))

    return rule


for _write in ("swa_write", "paged_write"):
    declare_op(
        f"encode_{_write}",
        QdqParams,
        _encode_write_rule(_write),
        f"operands as {_write}'s with `values [tokens, d] f32|bf16|f16` in place of its entries -> as "
        f"{_write}'s: {_write} of cache_encode(values, fmt) (ops/cache.py, ops/quant.py).",
        num_inputs=6,
    )


@params
class HcCollapseNormQdqParams(HcCollapseNormParams):
    qdq_fmt: str = "fp8_g32"
    qdq_dtype: str = SAME_DTYPE
    raw: bool = True


@params
class RMSNormRopeQdqParams(RMSNormRopeParams):
    qdq_fmt: str = "fp8_g32"
    qdq_dtype: str = SAME_DTYPE
    raw: bool = True


def inner_params(p: Any) -> Any:
    """The producer's own params inside a `<op>_qdq` op's params (its base class)."""
    return params_as(type(p).__mro__[1], p)


def qdq_params(p: Any) -> ActQdqParams:
    return ActQdqParams(fmt=p.qdq_fmt, out_dtype=p.qdq_dtype)


def _rule(producer: OpDef) -> Any:
    def rule(p: Any, ts: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
        (y,) = producer.infer(inner_params(p), ts)
        (q,) = get_op("act_qdq").infer(qdq_params(p), (y,))
        return (y, q) if p.raw else (q,)

    return rule


# producer op -> its fused op
FUSED_QDQ: dict[str, str] = {}


def _declare(producer: str, params_type: type) -> None:
    base = get_op(producer)
    name = f"{producer}_qdq"
    declare_op(
        name,
        params_type,
        _rule(base),
        f"as `{producer}` then `act_qdq` of its output (fmt=qdq_fmt, out_dtype=qdq_dtype): operands as "
        f"{producer}'s -> `(y, q)` with raw, `(q,)` without (ops/fused.py). {producer}: {base.doc}",
        num_inputs=base.num_inputs,
    )
    FUSED_QDQ[producer] = name


_declare("rms_norm", RMSNormQdqParams)
_declare("rope", RopeQdqParams)
_declare("swiglu", SwigluQdqParams)
_declare("hc_collapse_norm", HcCollapseNormQdqParams)
_declare("rms_norm_rope", RMSNormRopeQdqParams)
