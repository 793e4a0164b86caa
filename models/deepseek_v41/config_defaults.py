"""The defaults of config.json's fields: those of the reference config classes (NeMo AutoModel's
`DeepseekV41TextConfig` / `DeepseekV41Config`, which transformers' `save_pretrained` diffs against), i.e.
the released V4.1-Flash configuration. A field missing from config.json takes its value here, as it does
when NeMo or transformers load the file; docs/model-v41.md shows the same table.

`BASE_KEYS` are keys the reference classes' base (transformers' `PretrainedConfig`) writes that dsgraph
does not use; they are accepted silently. Any other unknown key is kept in `extra` with one warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["BASE_KEYS", "TEXT_DEFAULTS", "TOP_DEFAULTS", "text_default"]

TEXT_DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 5120,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1280,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 16,
        "beta_fast": 32,
        "beta_slow": 1,
        "original_max_position_embeddings": 65536,
    },
    "n_routed_experts": 384,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2304,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0] * 3,
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "engram_layer_ids": [1, 14],
    # with engram_layer_ids given and this missing: the released row counts, or [] without Engram layers
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_vocab_size": 16000000,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 3,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128,
    "dspark_num_experts_per_tok": 3,
    "hidden_act": "silu",
    "attention_bias": False,
    "dtype": "bfloat16",
}

TOP_DEFAULTS: Mapping[str, Any] = {
    "image_token_id": 129264,
    "pad_token_id": 2,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}

BASE_KEYS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "attention_dropout",
        "bos_token_id",
        "chunk_size_feed_forward",
        "dtype",
        "eos_token_id",
        "id2label",
        "initializer_range",
        "is_encoder_decoder",
        "label2id",
        "model_type",
        "output_attentions",
        "output_hidden_states",
        "pad_token_id",
        "problem_type",
        "quantization_config",
        "return_dict",
        "rope_parameters",
        "tie_word_embeddings",
        "torch_dtype",
        "transformers_version",
        "use_cache",
    }
)


def text_default(name: str, raw: Mapping[str, Any]) -> Any:
    """The default of text_config field `name` given the fields present (`raw`)."""
    if name == "engram_num_embeddings" and "engram_layer_ids" in raw and not raw["engram_layer_ids"]:
        return []
    return TEXT_DEFAULTS[name]
