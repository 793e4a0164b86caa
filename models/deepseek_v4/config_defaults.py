"""Defaults of a V4 `config.json` field: those of transformers' `DeepseekV4Config` (the released
V4-Flash values), used when a field is missing, as transformers does. docs/model-v4.md lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULTS", "KNOWN_RATIOS", "RELEASE_QUANT", "RELEASE_YARN", "default_ratios"]

# attention kind -> compression ratio: sliding window only, compressed sparse (CSA), heavily compressed (HCA)
KNOWN_RATIOS: Mapping[str, int] = {
    "sliding_attention": 0,
    "compressed_sparse_attention": 4,
    "heavily_compressed_attention": 128,
}

# The release's YaRN of the compressed layers and its quantization_config (not transformers' defaults:
# a config that omits them has plain RoPE and BF16 weights)
RELEASE_YARN: Mapping[str, Any] = {
    "rope_type": "yarn",
    "factor": 16,
    "beta_fast": 32,
    "beta_slow": 1,
    "original_max_position_embeddings": 65536,
}
RELEASE_QUANT: Mapping[str, Any] = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
    "expert_dtype": "fp4",
    "activation_scheme": "dynamic",
}

DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 4096,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "num_experts_per_tok": 6,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": None,
    "num_hash_layers": 3,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "swiglu_limit": 10.0,
    "sliding_window": 128,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 1,
    "tie_word_embeddings": False,
}


def default_ratios(num_layers: int) -> list[int]:
    """transformers' schedule when a config gives none: two HCA layers, then CSA and HCA alternating."""
    return [128] * min(num_layers, 2) + [4 if i % 2 else 128 for i in range(max(num_layers - 2, 0))]
