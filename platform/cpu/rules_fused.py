"""Reference meaning of the fused ops (ops/fused.py): the rules of the two ops they fuse, one after the
other (the fused op's meaning by construction)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from dsgraph.graph.op import NoParams
from dsgraph.ops.fused import FUSED_QDQ, compress_params, inner_params, qdq_params, rope_params
from dsgraph.ops.mhc import HcCollapseParams
from dsgraph.ops.nn import RMSNormParams
from dsgraph.platform.cpu import rules_cache, rules_core, rules_quant
from dsgraph.platform.cpu.rules_core import rms_norm
from dsgraph.platform.cpu.rules_mhc import hc_collapse, hc_expand, hc_pre
from dsgraph.platform.cpu.rules_moe import swiglu
from dsgraph.platform.cpu.rules_rope import rope


def hc_expand_pre(p: Any, y: Tensor, x: Tensor, post: Tensor, comb: Tensor, *pre_weights: Tensor) -> tuple:
    streams = hc_expand(NoParams(), y, x, post, comb)
    return (streams, *hc_pre(p, streams, *pre_weights))


def hc_collapse_norm(p: Any, x: Tensor, a: Tensor, w: Tensor) -> Tensor:
    row = hc_collapse(HcCollapseParams(out_dtype=p.out_dtype), x, a)
    return rms_norm(RMSNormParams(eps=p.eps), row, w)


def rms_norm_rope(p: Any, x: Tensor, w: Tensor, positions: Tensor) -> Tensor:
    return rope(rope_params(p), rms_norm(RMSNormParams(eps=p.eps), x, w), positions)


def linear_pair(p: Any, x: Tensor, w1: Tensor, s1: Tensor, w2: Tensor, s2: Tensor) -> tuple[Tensor, Tensor]:
    return rules_core.linear(p, x, w1, s1), rules_core.linear(p, x, w2, s2)


def encode_swa_write(p: Any, ring: Tensor, values: Tensor, *operands: Tensor) -> Tensor:
    return rules_cache.swa_write(None, ring, rules_quant.cache_encode(p, values), *operands)


def encode_paged_write(p: Any, pool: Tensor, values: Tensor, *operands: Tensor) -> Tensor:
    return rules_cache.paged_write(None, pool, rules_quant.cache_encode(p, values), *operands)


def _compress_then_norm(compress: Any) -> Any:
    """compress_norm's rule over a compress rule: `rules_cache.compress` (its state copied, the pure rule)
    or `compress_into` (the state written in place, for the platforms that update caches in place)."""

    def rule(p: Any, *operands: Tensor) -> tuple[Tensor, ...]:
        outs = compress(compress_params(p), *operands[:-1])
        return (rms_norm(RMSNormParams(eps=p.eps), outs[0], operands[-1]), *outs[1:])

    return rule


compress_norm = _compress_then_norm(rules_cache.compress)
compress_norm_into = _compress_then_norm(rules_cache.compress_into)


def then_qdq(p: Any, y: Tensor, act_qdq: Any = rules_quant.act_qdq) -> Tensor | tuple[Tensor, Tensor]:
    """A `<op>_qdq` op's outputs from its op's output y by `act_qdq` (a platform's rule of that op):
    (y, q), or q alone without `raw`."""
    q = act_qdq(qdq_params(p), y)
    return (y, q) if p.raw else q


def _fused(producer: Any) -> Any:
    def rule(p: Any, *operands: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return then_qdq(p, producer(inner_params(p), *operands))

    rule.__qualname__ = f"{producer.__name__}_qdq"
    return rule


_PRODUCERS = {
    "rms_norm": rms_norm,
    "rope": rope,
    "swiglu": swiglu,
    "hc_collapse_norm": hc_collapse_norm,
    "rms_norm_rope": rms_norm_rope,
}
RULES: dict[str, Any] = {
    "hc_expand_pre": hc_expand_pre,
    "hc_collapse_norm": hc_collapse_norm,
    "rms_norm_rope": rms_norm_rope,
    "linear_pair": linear_pair,
    "encode_swa_write": encode_swa_write,
    "encode_paged_write": encode_paged_write,
    "compress_norm": compress_norm,
    **{FUSED_QDQ[name]: _fused(rule) for name, rule in _PRODUCERS.items()},
}
# the rules of the fused ops that write a cache operand in place (platform/cuda/target.py INPLACE)
INPLACE_RULES: dict[str, Any] = {"compress_norm": compress_norm_into}
