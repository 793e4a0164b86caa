"""What one traced forward carries between layers: config, numerics, step inputs, caches, and the
cross-layer values a KV source or index layer publishes for the layers after it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsgraph.models.deepseek_v41.config import TextConfig
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.ops import op

Tracer = Any


@dataclass
class Forward:
    text: TextConfig
    num: Numerics
    weights: dict[str, Tracer]
    step: dict[str, Tracer]
    caches: dict[str, Tracer]
    engram_pad_id: int = -1  # normalised id of engram_pad_token_id (from the tokenizer's map)
    # Text only for now: image positions (Engram blocking, `bias_vl` routing) come with the multimodal
    # step input; like NeMo, a raw image token id inside a text prompt is treated as text.
    image_token_id: int = -1
    new_caches: dict[str, Tracer] = field(default_factory=dict)
    topk: dict[int, Tracer] = field(default_factory=dict)  # index layer -> its selection [T, k]
    candidates: Tracer | None = None  # candidate-source mask [T, E] of the ratio-1 source
    # KV sources whose compressed entries this step already wrote (a compact truncated step writes the
    # boundary's from every row before its block runs on the kept rows; models/deepseek_v41/truncation.py)
    compressed: set[int] = field(default_factory=set)
    debug: dict[str, Tracer] | None = None  # extra outputs for tests and dumps (`trace_step(debug=True)`)
    expert_parallel: bool = False  # the MoEs exchange rows over an EP group (ffn_block.moe)

    def record(self, name: str, value: Tracer) -> None:
        if self.debug is not None:
            self.debug[name] = value

    def w(self, name: str) -> Tracer:
        return self.weights[name]

    def cache(self, name: str) -> Tracer:
        """The latest value of a cache: updated this step if written, else the step's input."""
        return self.new_caches.get(name, self.caches[name])

    def linear(
        self, x: Tracer, name: str, out_dtype: str | None = None, *, quantized_input: bool = True
    ) -> Tracer:
        """`x @ W^T` for weight `name` in whatever format the weights dict holds it; an FP8 weight reads x
        through `act_quantize` unless `quantized_input` is False (x used as is)."""
        out = out_dtype or self.num.act_dtype
        scale = self.weights.get(name.removesuffix(".weight") + ".scale")
        if scale is None:
            return op.linear(self.cast(x, self.w(name).dtype), self.w(name), out_dtype=out)
        if quantized_input:
            x = self.act_quantize(x)
        return op.linear(x, self.w(name), scale, weight_format="fp8_block32", out_dtype=out)

    def act_quantize(self, x: Tracer) -> Tracer:
        """x as an FP8-weight GEMM of these numerics reads it: FP8-g32 quantize-dequantized in `serving`.

        An op of its own, not the linear's act_quant, so that the linears reading one activation (wq_a and
        wkv, the shared expert's w1 and w3, the indexer's and the attention's wq_b) read one quantization:
        their equations are equal, and CSE keeps one. Stored in bf16, where the FP8 values times their
        power-of-two scales are exact: the GEMMs see the values an f32 copy would hold."""
        if self.num.act_quant == "none":
            return x
        return op.act_qdq(x, fmt=self.num.act_quant, out_dtype="bf16")

    def cast(self, x: Tracer, dtype: str) -> Tracer:
        return x if x.dtype == dtype else op.cast(x, dtype=dtype)

    def norm(self, x: Tracer, name: str) -> Tracer:
        return op.rms_norm(x, self.w(name), eps=self.text.rms_norm_eps)

    def rope(
        self, x: Tracer, positions: Tracer, theta: float, use_yarn: bool, *, inverse: bool = False
    ) -> Tracer:
        t = self.text
        scaling = t.rope_scaling
        yarn = (
            dict(
                yarn_factor=float(scaling.factor),
                beta_fast=float(scaling.beta_fast),
                beta_slow=float(scaling.beta_slow),
                original_max=int(scaling.original_max_position_embeddings),
            )
            if use_yarn and scaling is not None
            else {}
        )
        return op.rope(x, positions, rope_dim=t.qk_rope_head_dim, theta=float(theta), inverse=inverse, **yarn)
