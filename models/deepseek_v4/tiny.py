"""Small random V4 checkpoints in the released on-disk layout (`dsgraph make-tiny --model-type deepseek_v4`).

The tiny config has every layer kind once or more: a hash-routed sliding-window layer, CSA (ratio 4,
overlapping, with an indexer), HCA (ratio 16 here, 128 in the release, so short prompts close windows)
and plain sliding-window layers, with a window of 8 and an indexer top-k of 3 (smaller than test prompts,
so ring wrap-around and selection are exercised). Weights use the release's 128 x 128 FP8 blocks and FP4
experts. The tokenizer is V4.1's tiny WordLevel fixture.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors
from dsgraph.models.deepseek_v4.config import V4Config, parse_config
from dsgraph.models.deepseek_v4.config_defaults import RELEASE_QUANT, RELEASE_YARN
from dsgraph.models.deepseek_v4.mtp import mtp_tensors
from dsgraph.models.deepseek_v41.checkpoint_io import torch_dtype, write_checkpoint
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, scale_name
from dsgraph.models.deepseek_v41.tiny import quantize_tensor, sample_weight
from dsgraph.models.deepseek_v41.tokenizer_fixture import fixture_tokenizer

__all__ = ["TINY_CONFIG", "make_tiny", "tiny_config_dict"]

TINY_CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v4",
    "architectures": ["DeepseekV4ForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 32,
    "num_experts_per_tok": 2,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "routed_scaling_factor": 1.5,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {**RELEASE_YARN, "original_max_position_embeddings": 64},
    "compress_ratios": [0, 4, 16, 4, 0],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    "num_hash_layers": 1,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "swiglu_limit": 10.0,
    "sliding_window": 8,
    "o_groups": 2,
    "o_lora_rank": 32,
    "index_n_heads": 4,
    "index_head_dim": 32,
    "index_topk": 3,
    "num_nextn_predict_layers": 0,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "quantization_config": dict(RELEASE_QUANT),
}


def tiny_config_dict(**overrides: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(TINY_CONFIG)
    cfg.update(copy.deepcopy(overrides))
    return cfg


def random_weights(cfg: V4Config, seed: int) -> dict[str, Tensor]:
    """Logical (dequantized) weights, the MTP layer's included; `tid2eid` gives each token distinct
    random experts."""
    gen = torch.Generator().manual_seed(seed)
    t, out = cfg.text, {}
    for name, spec in {**expected_tensors(cfg), **mtp_tensors(cfg)}.items():
        if spec.kind is TensorKind.SCALE:
            continue
        if name.endswith("tid2eid"):
            noise = torch.rand(t.vocab_size, t.n_routed_experts, generator=gen)
            out[name] = noise.argsort(dim=1)[:, : t.num_experts_per_tok].to(torch.int64)
        elif name.endswith(".ape"):
            out[name] = 0.5 * torch.randn(spec.shape, generator=gen)
        else:
            out[name] = sample_weight(name, spec.logical_shape, gen)
    return out


def quantize_weights(cfg: V4Config, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    for name, spec in {**expected_tensors(cfg), **mtp_tensors(cfg)}.items():
        if spec.kind is TensorKind.SCALE:
            continue
        if spec.kind is TensorKind.PLAIN:
            out[name] = weights[name].to(torch_dtype(spec.dtype))
        else:
            out[name], out[scale_name(name)] = quantize_tensor(spec, weights[name], block)
    return out


def make_tiny(out_dir: str | Path, *, seed: int = 0, overrides: dict[str, Any] | None = None) -> Path:
    """Write a random V4 checkpoint (shards, index, config.json, tokenizer.json) into `out_dir`."""
    cfg_dict = tiny_config_dict(**(overrides or {}))
    cfg = parse_config(cfg_dict)
    tok = fixture_tokenizer("tiny", cfg.text.vocab_size)
    out = write_checkpoint(out_dir, quantize_weights(cfg, random_weights(cfg, seed)), cfg_dict)
    tok.save(str(out / "tokenizer.json"))
    return out
