"""DeepInfer's `serving` rounding points added to NeMo's FP32 V4.1 model: an independent small reference.

The model logic is NeMo's (`nemo_ref.load_nemo_model`, the same released-format checkpoint). This module
only rounds values at module boundaries (forward hooks, pre-hooks, a per-instance `expand`) and swaps two
functions of NeMo's attention module for the time of one forward. The codecs are the shared ones of
`dsgraph.platform.cpu.quant`. Values stay FP32 tensors holding BF16 / FP8 / FP4 values, so NeMo's own
`.to(dtype)` casts change nothing. Points (spec numerics-nemo-vs-deepinfer, section in brackets):

- FP8-g32 (E4M3, UE8M0) quantize-dequantize of the input of every FP8/FP4-weight GEMM [2d]: attention
  wq_a, wkv, wq_b, wo_a (grouped), wo_b, indexer wq_b, shared experts w1/w3/w2, routed experts w1/w3 and w2
  (the input of w2 is the weighted SwiGLU output). Not the Engram wkv: its input rows are FP8 already [2d].
- BF16 rounding where DeepInfer has BF16 values: the residual streams after each mHC expand and after
  Engram [4a, 4c]; the stream collapses (inputs of attn_norm, ffn_norm, the final norm) [4a]; the outputs
  of attn_norm, q_norm, kv_norm, the compressor norm, the index k_norm, ffn_norm and the final norm [1a];
  the GEMM outputs of wq_a, wq_b, wkv, wo_b, the indexer wq_b and wk, the shared expert's w1/w3/w2, each
  routed expert's gate/up output (before the clamp) and down output (before NeMo's FP32 combine) [2d, 5b];
  the pooled (ratio 2) or projected (ratio 1) compressor latent before its norm [3a]; the indexer head
  weights (weights_proj output) [3b]; every forward RoPE output (query, SWA KV, compressed KV, index keys and
  queries: FP8/NVFP4/MXFP4 amax is taken over BF16 values) and the attention output before and after the
  inverse RoPE [1b, 1d, 2a-2c]; the MoE output [5b]. The LM head reads the BF16 final-norm output with FP32
  accumulation and logits [6].
- Straight from FP32 to FP8, with no BF16 rounding first: the wo_a output (the input of wo_b; DeepInfer's
  einsum writes FP8) and the SwiGLU outputs (the inputs of the shared and routed w2; fused swiglu+cast) [2d].
- Left in FP32: the mHC coefficients; the routed experts' combine (DeepEP's accumulation cannot be read).
- NVFP4 compressed-cache values by reciprocal multiply, x * fl32(1/sf) [2c]; no 1/sqrt(heads * dim)
  scale on the indexer head weights [3b]. FP8 SWA KV and MXFP4 index Q/K stay NeMo's own.

`routed_bf16=False` leaves the routed experts' BF16 gate/up and down outputs out (`ROUTED_BF16`), so a test
can show that the match sees them.

`boundaries=` collects NeMo's values where our graph records its own (`trace_step(debug=True)`): the inputs of
the cache quantizer (`kv`, `ckv`, `kidx`, `iq`) and the indexer head weights without NeMo's scale (`iw`), by
(layer, kind). Several of these points (the whole index path) do not reach the logits of a config that
selects everything, so a test can only see them there.
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

__all__ = ["ROUTED_BF16", "Boundaries", "serving_logits", "serving_numerics"]

Boundaries = dict[tuple[int, str], Tensor]  # (layer, kind) -> NeMo's values [rows, ...], batch dim dropped

# DeepInfer's BF16 points inside the routed experts (our `moe_experts` op, gemm_out_dtype): `routed_bf16`.
ROUTED_BF16 = (
    "routed experts: gate/up GEMM outputs rounded to BF16 before the clamp [5b]",
    "routed experts: each expert's down output rounded to BF16 before the combine [5b]",
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


class _Recorder:
    """Keeps NeMo's boundary values by (layer, kind) when asked to; `layer` follows the running attention."""

    def __init__(self, out: Boundaries | None) -> None:
        self.out, self.layer = out, -1

    def at_layer(self, index: int) -> Callable[[Tensor], Tensor]:
        def enter(x: Tensor) -> Tensor:
            self.layer = index
            return x

        return enter

    def keep(self, kind: str) -> Callable[[Tensor], Tensor]:
        def put(x: Tensor) -> Tensor:
            if self.out is not None:
                self.out[(self.layer, kind)] = x[0].detach().clone()
            return x

        return put


def _chain(*fns: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        for fn in fns:
            x = fn(x)
        return x

    return run


def _gemm(pts: _Points, linear: nn.Module, *, round_out: bool) -> None:
    """An FP8/FP4-weight GEMM: FP8-g32 input; BF16 output where DeepInfer has one."""
    pts.before(linear, _fp8)
    if round_out:
        pts.after(linear, _bf16)


def _attention(pts: _Points, attn: nn.Module, rec: _Recorder) -> None:
    _gemm(pts, attn.wq_a, round_out=True)
    pts.after(attn.q_norm, _bf16)
    _gemm(pts, attn.wq_b, round_out=True)
    _gemm(pts, attn.wkv, round_out=True)
    pts.after(attn.kv_norm, _bf16)
    _gemm(pts, attn.wo_a, round_out=False)  # FP8 input of wo_b straight from FP32 (wo_b's pre-hook)
    _gemm(pts, attn.wo_b, round_out=True)
    if attn.compressor is not None:
        # NeMo's compressor returns norm(pooled) (ratio 2) or norm(wkv(x)) (ratio 1): both ends are hooked.
        pts.before(attn.compressor.norm, _bf16)
        pts.after(attn.compressor.norm, _bf16)
    if attn.indexer is not None:
        _indexer(pts, attn.indexer, rec)


def _indexer(pts: _Points, indexer: nn.Module, rec: _Recorder) -> None:
    _gemm(pts, indexer.wq_b, round_out=True)
    # NeMo multiplies the head weights by this scale; dividing first leaves them unscaled (DeepInfer), to
    # one FP32 rounding of the product, which moves no ranking except an exact near-tie.
    scale = indexer.head_dim**-0.5 * indexer.num_heads**-0.5
    pts.after(indexer.weights_proj, _chain(_bf16, rec.keep("iw"), lambda w: w / scale))
    if indexer.owns_keys:  # BF16 weight, BF16 GEMM output, no FP8 input [2d]
        pts.after(indexer.wk, _bf16)
        pts.after(indexer.k_norm, _bf16)


class _BF16Product:
    """The input of an expert's down GEMM as NeMo's per-expert loop uses it: `a @ w2` is the only thing
    the loop does with it, so this rounds each expert's down output to BF16 before the FP32 combine."""

    def __init__(self, a: Tensor) -> None:
        self.a = a

    def __matmul__(self, w2: Tensor) -> Tensor:
        return _bf16(self.a @ w2)


def _moe(pts: _Points, ffn: nn.Module, routed_bf16: bool) -> None:
    experts, shared = ffn.experts, ffn.shared_experts
    after_down = experts.config.apply_router_weight_after_down
    if routed_bf16 and (experts.use_torch_mm or after_down):
        raise RuntimeError(
            f"serving_ref: experts with use_torch_mm={experts.use_torch_mm}, apply_router_weight_after_down="
            f"{after_down}; the routed BF16 points need the per-expert loop (False) with the routing weight "
            "before down (False)"
        )
    pts.before(experts, _fp8)
    activation = experts.expert_activation_grouped

    def weighted_swiglu(gate_up: Tensor, probs: Tensor) -> Tensor | _BF16Product:
        if not routed_bf16:
            return _fp8(activation(gate_up, probs))
        # BF16 gate/up outputs; the weighted SwiGLU output is w2's FP8 input; BF16 down output.
        return _BF16Product(_fp8(activation(_bf16(gate_up), probs)))

    pts.attribute(experts, "expert_activation_grouped", weighted_swiglu)
    for linear in (shared.gate_proj, shared.up_proj, shared.down_proj):
        _gemm(pts, linear, round_out=True)
    pts.after(ffn, _bf16)


def _block(pts: _Points, layer: nn.Module, routed_bf16: bool, rec: _Recorder) -> None:
    if layer.engram is not None:
        pts.after(layer.engram, _bf16)
    for norm in (layer.attn_norm, layer.ffn_norm):
        pts.before(norm, _bf16)  # the stream collapse
        pts.after(norm, _bf16)
    for hc in (layer.attn_hc, layer.ffn_hc):
        expand = hc.expand  # NeMo's staticmethod; shadowed on this instance only
        pts.attribute(hc, "expand", lambda out, res, mix, expand=expand: _bf16(expand(out, res, mix)))
    _attention(pts, layer.attn, rec)
    _moe(pts, layer.ffn, routed_bf16)


_NEMO_APPLY_ROPE = nemo_attention._apply_rope
_NEMO_QUANTIZE_CACHE = nemo_attention.quantize_cache


def _serving_rope(values: Tensor, angles: Tensor, *, inverse: bool = False) -> Tensor:
    """DeepInfer's RoPE kernels read and write BF16 [1b]."""
    if inverse:  # the attention output, BF16, rotated back and rounded again
        return _bf16(_NEMO_APPLY_ROPE(_bf16(values), angles, inverse=True))
    return _bf16(_NEMO_APPLY_ROPE(values, angles))


def _cache_quantizer(rec: _Recorder) -> Callable[..., Tensor]:
    def quantize_cache(values: Tensor, *, format: str, block_size: int) -> Tensor:  # noqa: A002 (NeMo's name)
        kind = {"fp8": "kv", "nvfp4": "ckv"}.get(format) or ("iq" if values.dim() == 4 else "kidx")
        rec.keep(kind)(values)
        if format == "nvfp4":
            if block_size != 16:
                raise ValueError(f"serving_ref: NVFP4 cache block_size {block_size}, expected 16")
            return nvfp4_g16_qdq(values, mode="reciprocal")
        return _NEMO_QUANTIZE_CACHE(values, format=format, block_size=block_size)

    return quantize_cache


@contextmanager
def serving_numerics(
    model: nn.Module, *, routed_bf16: bool = True, boundaries: Boundaries | None = None
) -> Iterator[None]:
    """Within the block, a NeMo `DeepseekV41ForCausalLM` computes with the serving rounding points
    (and fills `boundaries`, when given, with its values at our recorded points)."""
    if nemo_attention._apply_rope is not _NEMO_APPLY_ROPE:
        raise RuntimeError("serving_numerics: already active (it is not re-entrant)")
    pts, rec = _Points(), _Recorder(boundaries)
    try:
        for name, layer in model.model.layers.items():
            pts.before(layer.attn, rec.at_layer(int(name)))
            _block(pts, layer, routed_bf16, rec)
        pts.before(model.model.norm, _bf16)  # the final collapse
        pts.after(model.model.norm, _bf16)
        pts.attribute(nemo_attention, "_apply_rope", _serving_rope)
        pts.attribute(nemo_attention, "quantize_cache", _cache_quantizer(rec))
        yield
    finally:
        pts.remove()


def serving_logits(
    model: nn.Module, ids: list[int], *, routed_bf16: bool = True, boundaries: Boundaries | None = None
) -> Tensor:
    """Logits [len(ids), vocab] FP32 of one prompt with the serving rounding points (positions 0..len-1)."""
    with serving_numerics(model, routed_bf16=routed_bf16, boundaries=boundaries):
        return nemo_logits(model, ids)
