"""DeepInfer's `serving` rounding points added to NeMo's FP32 V4.1 model: an independent small reference.

The model logic is NeMo's (`nemo_ref.load_nemo_model`, the same released-format checkpoint). This module
only rounds values at module boundaries (forward hooks, pre-hooks, a per-instance `expand`) and swaps two
functions of NeMo's attention module for the time of one forward. The codecs are the shared ones of
`dsgraph.platform.cpu.quant`. Values stay FP32 tensors holding BF16 / FP8 / FP4 values, so NeMo's own
`.to(dtype)` casts change nothing. Points (spec numerics-nemo-vs-deepinfer, section in brackets):

- FP8-g32 (E4M3, UE8M0) quantize-dequantize of the input of every FP8/FP4-weight GEMM [2d]: attention
  wq_a, wkv, wq_b, wo_a (grouped), wo_b, indexer wq_b, shared experts w1/w3/w2, routed experts w1/w3 and w2
  (the input of w2 is the weighted SwiGLU output). Not the Engram wkv: its input rows are FP8 already [2d].
- BF16 rounding where our graph keeps BF16 activations (the `act_dtype` points of `models/deepseek_v41`):
  the residual streams after each mHC expand and after Engram [4a, 4c]; the stream collapses (inputs of
  attn_norm, ffn_norm, the final norm) [4a]; the outputs of attn_norm, q_norm, ffn_norm and the final
  norm [1a]; the GEMM outputs of wq_a, wq_b, wo_a, wo_b [2d]; the query after RoPE and the attention output
  before and after the inverse RoPE [1b, 1d]; the shared expert's SwiGLU output; the MoE output [5b].
  The LM head reads the BF16 final-norm output with FP32 accumulation and logits [6].
- Left in FP32 as our graph leaves them: the SWA KV path up to its FP8 boundary, the compressor and the
  index keys up to their NVFP4 / MXFP4 boundaries, the index queries and head weights, the expert gate/up
  and down outputs, the mHC coefficients.
- NVFP4 compressed-cache values by reciprocal multiply, x * fl32(1/sf) [2c]; no 1/sqrt(heads * dim)
  scale on the indexer head weights [3b]. FP8 SWA KV and MXFP4 index Q/K stay NeMo's own.

`strict=True` adds the further BF16 points that DeepInfer has and our graph does not (`STRICT_ONLY`), so
a test can measure what leaving them out costs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from nemo_automodel.components.models.deepseek_v41 import attention as nemo_attention
from torch import Tensor, nn

from dsgraph.platform.cpu.quant import fp8_g32_qdq, nvfp4_g16_qdq
from tests.oracle.nemo_ref import nemo_logits

__all__ = ["STRICT_ONLY", "serving_logits", "serving_numerics"]

# DeepInfer's BF16 points that our serving graph leaves out (with `strict=True` this module adds them).
STRICT_ONLY = (
    "SWA KV: wkv GEMM output, kv_norm output and RoPE output in BF16 before the FP8 cast [1a, 1b, 2a]",
    "compressor: pooled latent (ratio 2) / wkv output (ratio 1) and its norm output in BF16 [3a]",
    "RoPE outputs of the compressed KV, index keys and index queries in BF16 before NVFP4/MXFP4 [1b]",
    "indexer: wq_b, wk and k_norm outputs in BF16; head weights (weights_proj output) in BF16 [3b]",
    "wo_a output goes to FP8 directly, without our BF16 rounding first [2d use_fp8_einsum_output]",
    "shared expert SwiGLU output goes to FP8 directly, without our BF16 rounding first [2d, 5b]",
    "expert gate/up GEMM outputs (routed and shared) and the shared down output rounded to BF16 [5b]; the "
    "routed experts' own down outputs are not (NeMo sums them inside one loop, no hook point)",
)


def _bf16(x: Tensor) -> Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def _fp8(x: Tensor) -> Tensor:
    return fp8_g32_qdq(x.float()).to(x.dtype)


class _Points:
    """Installed hooks and patches, undone by `remove` (the cached NeMo model must come back unchanged)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def before(self, module: nn.Module, fn: Callable[[Tensor], Tensor]) -> None:
        """Replace the module's first positional input x by fn(x)."""
        handle = module.register_forward_pre_hook(lambda _m, args: (fn(args[0]), *args[1:]))
        self._undo.append(handle.remove)

    def after(self, module: nn.Module, fn: Callable[[Tensor], Tensor]) -> None:
        """Replace the module's output y by fn(y)."""
        handle = module.register_forward_hook(lambda _m, _args, out: fn(out))
        self._undo.append(handle.remove)

    def attribute(self, owner: Any, name: str, value: Any) -> None:
        """Shadow (instance) or replace (module global) `owner.name` until `remove`."""
        in_dict = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old) if in_dict else delattr(owner, name))

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


def _chain(*fns: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        for fn in fns:
            x = fn(x)
        return x

    return run


def _gemm(pts: _Points, linear: nn.Module, *, round_out: bool) -> None:
    """An FP8/FP4-weight GEMM: FP8-g32 input; BF16 output when our graph rounds it."""
    pts.before(linear, _fp8)
    if round_out:
        pts.after(linear, _bf16)


def _attention(pts: _Points, attn: nn.Module, strict: bool) -> None:
    _gemm(pts, attn.wq_a, round_out=True)
    pts.after(attn.q_norm, _bf16)
    _gemm(pts, attn.wq_b, round_out=True)
    _gemm(pts, attn.wkv, round_out=strict)
    _gemm(pts, attn.wo_a, round_out=not strict)
    _gemm(pts, attn.wo_b, round_out=True)
    if strict:
        pts.after(attn.kv_norm, _bf16)
    if attn.compressor is not None and strict:
        pts.before(attn.compressor.norm, _bf16)
        pts.after(attn.compressor.norm, _bf16)
    if attn.indexer is not None:
        _indexer(pts, attn.indexer, strict)


def _indexer(pts: _Points, indexer: nn.Module, strict: bool) -> None:
    _gemm(pts, indexer.wq_b, round_out=strict)
    # NeMo multiplies the head weights by this scale; dividing first leaves them unscaled (DeepInfer), to
    # one FP32 rounding of the product, which moves no ranking except an exact near-tie.
    scale = indexer.head_dim**-0.5 * indexer.num_heads**-0.5
    pts.after(indexer.weights_proj, _chain(_bf16, lambda w: w / scale) if strict else (lambda w: w / scale))
    if indexer.owns_keys and strict:
        pts.after(indexer.wk, _bf16)
        pts.after(indexer.k_norm, _bf16)


def _moe(pts: _Points, ffn: nn.Module, strict: bool) -> None:
    experts, shared = ffn.experts, ffn.shared_experts
    pts.before(experts, _fp8)
    activation = experts.expert_activation_grouped

    def weighted_swiglu(gate_up: Tensor, probs: Tensor) -> Tensor:
        # The weighted SwiGLU output is the input of w2.
        return _fp8(activation(_bf16(gate_up) if strict else gate_up, probs))

    pts.attribute(experts, "expert_activation_grouped", weighted_swiglu)
    for linear in (shared.gate_proj, shared.up_proj):
        _gemm(pts, linear, round_out=strict)
    pts.before(shared.down_proj, _fp8 if strict else _chain(_bf16, _fp8))
    if strict:
        pts.after(shared.down_proj, _bf16)
    pts.after(ffn, _bf16)


def _block(pts: _Points, layer: nn.Module, strict: bool) -> None:
    if layer.engram is not None:
        pts.after(layer.engram, _bf16)
    for norm in (layer.attn_norm, layer.ffn_norm):
        pts.before(norm, _bf16)  # the stream collapse
        pts.after(norm, _bf16)
    for hc in (layer.attn_hc, layer.ffn_hc):
        expand = hc.expand  # NeMo's staticmethod; shadowed on this instance only
        pts.attribute(hc, "expand", lambda out, res, mix, expand=expand: _bf16(expand(out, res, mix)))
    _attention(pts, layer.attn, strict)
    _moe(pts, layer.ffn, strict)


_NEMO_APPLY_ROPE = nemo_attention._apply_rope
_NEMO_QUANTIZE_CACHE = nemo_attention.quantize_cache


def _rope(strict: bool, heads: int, head_dim: int) -> Callable[..., Tensor]:
    rope = _NEMO_APPLY_ROPE

    def serving_rope(values: Tensor, angles: Tensor, *, inverse: bool = False) -> Tensor:
        if inverse:  # the attention output, BF16 in our graph, rotated back and rounded again
            return _bf16(rope(_bf16(values), angles, inverse=True))
        rotated = rope(values, angles)
        is_query = values.dim() == 4 and tuple(values.shape[-2:]) == (heads, head_dim)
        return _bf16(rotated) if strict or is_query else rotated

    return serving_rope


def _quantize_cache(values: Tensor, *, format: str, block_size: int) -> Tensor:
    if format == "nvfp4":
        if block_size != 16:
            raise ValueError(f"serving_ref: NVFP4 cache block_size {block_size}, expected 16")
        return nvfp4_g16_qdq(values, mode="reciprocal")
    return _NEMO_QUANTIZE_CACHE(values, format=format, block_size=block_size)


@contextmanager
def serving_numerics(model: nn.Module, *, strict: bool = False) -> Iterator[None]:
    """Within the block, a NeMo `DeepseekV41ForCausalLM` computes with the serving rounding points."""
    text = model.config.text_config
    heads, head_dim = text.num_attention_heads, text.head_dim
    if (text.index_n_heads, text.index_head_dim) == (heads, head_dim):
        # The RoPE patch tells attention queries from index queries by their [heads, head_dim] shape.
        raise ValueError(
            f"serving_ref: index heads [{text.index_n_heads}, {text.index_head_dim}] equal attention heads "
            f"[{heads}, {head_dim}]; expected them to differ"
        )
    if nemo_attention._apply_rope is not _NEMO_APPLY_ROPE:
        raise RuntimeError("serving_numerics: already active (it is not re-entrant)")
    pts = _Points()
    try:
        for layer in model.model.layers.values():
            _block(pts, layer, strict)
        pts.before(model.model.norm, _bf16)  # the final collapse
        pts.after(model.model.norm, _bf16)
        pts.attribute(nemo_attention, "_apply_rope", _rope(strict, heads, head_dim))
        pts.attribute(nemo_attention, "quantize_cache", _quantize_cache)
        yield
    finally:
        pts.remove()


def serving_logits(model: nn.Module, ids: list[int], *, strict: bool = False) -> Tensor:
    """Logits [len(ids), vocab] FP32 of one prompt with the serving rounding points (positions 0..len-1)."""
    with serving_numerics(model, strict=strict):
        return nemo_logits(model, ids)
