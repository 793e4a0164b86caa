"""The two numerics modes of the model (spec numerics-nemo-vs-deepinfer.md, section 11).

`reference` computes what the independent oracle (NeMo, FP32 on CPU) computes: FP32 activations,
dequantized FP32 weights, no quantization of GEMM inputs, NVFP4 values by true division.
`serving` (the default) computes what DeepSeek's engine computes: BF16 activations, weights in their
stored FP8/FP4 formats, dynamic FP8 E4M3 (UE8M0, groups of 32) quantization of every FP8/FP4-weight
GEMM input, NVFP4 values by multiplying with the reciprocal scale, and no 1/sqrt scaling of the indexer
head weights (it does not change rankings). The cache-format value boundaries hold in both modes.

`serving` rounds to BF16 where DeepInfer holds BF16 values: GEMM outputs (also wkv, the indexer's wq_b, wk
and weights_proj, the shared expert's w1/w3/w2), norm and RoPE outputs (also on the SWA KV, compressed KV and
index paths, so their FP8/FP4 scales come from BF16 values) and the compressor latent. Where DeepInfer's
kernel writes FP8 straight from its f32 accumulator (the wo_a einsum, swiglu+cast) there is no BF16 step.
Inside the routed experts (`moe_experts` with `gemm_out_dtype=act_dtype`) each expert's gate/up GEMM
outputs are BF16 before the clamp and its down output is BF16 before the f32 combine (5b).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["reference", "serving"]


@dataclass(frozen=True, slots=True)
class Numerics:
    mode: Mode
    act_dtype: str  # dtype of activations between ops: "f32" or "bf16"
    act_quant: str  # "none" or "fp8_g32": activation quantization at FP8/FP4-weight GEMM inputs
    nvfp4_fmt: str  # "nvfp4_g16" (divide) or "nvfp4_g16_recip" (reciprocal multiply)
    scale_index_weights: bool  # multiply indexer head weights by 1/sqrt(heads * head_dim)
    stored_weights: bool  # keep FP8/FP4 weights as stored (else dequantized to f32)


REFERENCE = Numerics("reference", "f32", "none", "nvfp4_g16", True, False)
SERVING = Numerics("serving", "bf16", "fp8_g32", "nvfp4_g16_recip", False, True)


def numerics_for(mode: str) -> Numerics:
    if mode == "reference":
        return REFERENCE
    if mode == "serving":
        return SERVING
    raise ValueError(f"numerics: {mode!r} is not one of ('reference', 'serving')")
