"""transformers' DeepseekV4ForCausalLM loaded with a V4 checkpoint's dequantized weights: the oracle of
tests/oracle/test_v4_*.py (CPU, FP32, eager) and the transformers side of `dsgraph bench v4` (GPU, BF16).

The renaming below is written from the release's tensor names (models/deepseek_v4/checkpoint_spec.py) to
the module names of transformers' implementation; experts are stacked as its `gate_up_proj` [E, 2I, H]
(w1 then w3) and `down_proj` [E, H, I].
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors, is_skipped
from dsgraph.models.deepseek_v4.config import V4Config
from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint

_LEAF = [
    (r"^embed\.weight$", "model.embed_tokens.weight"),
    (r"^head\.weight$", "lm_head.weight"),
    (r"^norm\.weight$", "model.norm.weight"),
    (r"^hc_head_(fn|base|scale)$", r"model.hc_head.hc_\1"),
]
# first match wins, on the part after `layers.{i}.`; COMP then names the compressor's own tensors
_LAYER = [
    (r"attn_norm\.", "input_layernorm."),
    (r"ffn_norm\.", "post_attention_layernorm."),
    (r"hc_(attn|ffn)_(fn|base|scale)$", r"\1_hc.\2"),
    (r"attn\.indexer\.compressor\.", "self_attn.compressor.indexer.COMP."),
    (r"attn\.indexer\.wq_b\.", "self_attn.compressor.indexer.q_b_proj."),
    (r"attn\.indexer\.weights_proj\.", "self_attn.compressor.indexer.scorer.weights_proj."),
    (r"attn\.compressor\.", "self_attn.compressor.COMP."),
    (r"attn\.wq_a\.", "self_attn.q_a_proj."),
    (r"attn\.q_norm\.", "self_attn.q_a_norm."),
    (r"attn\.wq_b\.", "self_attn.q_b_proj."),
    (r"attn\.wkv\.", "self_attn.kv_proj."),
    (r"attn\.kv_norm\.", "self_attn.kv_norm."),
    (r"attn\.wo_a\.", "self_attn.o_a_proj."),
    (r"attn\.wo_b\.", "self_attn.o_b_proj."),
    (r"attn\.attn_sink$", "self_attn.sinks"),
    (r"ffn\.gate\.bias$", "mlp.gate.e_score_correction_bias"),
    (r"ffn\.gate\.", "mlp.gate."),
    (r"ffn\.shared_experts\.w1\.", "mlp.shared_experts.gate_proj."),
    (r"ffn\.shared_experts\.w2\.", "mlp.shared_experts.down_proj."),
    (r"ffn\.shared_experts\.w3\.", "mlp.shared_experts.up_proj."),
]
_COMP = [(r"COMP\.wkv\.", "kv_proj."), (r"COMP\.wgate\.", "gate_proj."), (r"COMP\.ape$", "position_bias")]
_COMP.append((r"COMP\.norm\.", "kv_norm."))
_EXPERT = re.compile(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight")


def hf_config(cfg_dict: dict[str, Any], cfg: V4Config) -> Any:
    from transformers import DeepseekV4Config

    t = cfg.text
    names = {
        0: "sliding_attention",
        t.csa_ratio: "compressed_sparse_attention",
        t.hca_ratio: "heavily_compressed_attention",
    }
    kept = {
        k: v
        for k, v in cfg_dict.items()
        if k
        not in (
            "quantization_config",
            "compress_ratios",
            "num_hash_layers",
            "qk_rope_head_dim",
            "rope_scaling",
            "architectures",
            "model_type",
            "dtype",
        )
    }
    kept.update(
        layer_types=[names[r] for r in t.compress_ratios],
        mlp_layer_types=["hash_moe"] * t.num_hash_layers
        + ["moe"] * (t.num_hidden_layers - t.num_hash_layers),
        partial_rotary_factor=t.qk_rope_head_dim / t.head_dim,
        rope_parameters=dict(cfg_dict["rope_scaling"]) if cfg_dict.get("rope_scaling") else None,
    )
    hf = DeepseekV4Config(**kept)
    hf._attn_implementation = "eager"
    return hf


def _first_sub(rules: list[tuple[str, str]], name: str) -> str:
    for pattern, repl in rules:
        if re.match(pattern, name) or re.search(pattern, name) and pattern.startswith("COMP"):
            return re.sub(pattern, repl, name, count=1)
    return name


def hf_name(name: str) -> str:
    """transformers' name of a released tensor that is not a routed expert's."""
    new = name
    for pattern, repl in _LEAF:
        new = re.sub(pattern, repl, new)
    if new.startswith("layers."):
        head, rest = re.match(r"(layers\.\d+\.)(.*)", new).groups()
        rest = _first_sub(_LAYER, rest)
        new = "model." + head + _first_sub(_COMP, rest)
    return new


def _target(params: dict[str, Tensor], name: str) -> tuple[str, Tensor]:
    """The model tensor (or the slice of a stacked expert tensor) a released tensor fills."""
    m = _EXPERT.fullmatch(name)
    if m is None:
        key = hf_name(name)
        if key not in params:
            raise KeyError(f"transformers V4: no tensor {key!r} for checkpoint tensor {name!r}")
        return key, params[key]
    layer, expert, which = int(m[1]), int(m[2]), m[3]
    key = f"model.layers.{layer}.mlp.experts." + ("down_proj" if which == "w2" else "gate_up_proj")
    stacked = params[key][expert]
    half = stacked.shape[0] // 2
    return key, {"w1": stacked[:half], "w3": stacked[half:], "w2": stacked}[which]


def copy_weights(model: Any, weights: dict[str, Tensor]) -> None:
    """Copy the checkpoint's tensors into the model's own (cast to each parameter's dtype and device);
    `weights` is emptied as it goes, so nothing is ever held twice: not on the host (the dequantized
    experts of full-width layers), not on the GPU (the model and a second copy of its weights)."""
    params = model.state_dict(keep_vars=True)  # the parameters and persistent buffers themselves
    filled: set[str] = set()
    with torch.no_grad():
        for name in list(weights):
            w = weights.pop(name)
            key, dest = _target(params, name)
            if dest.shape != w.shape:
                raise ValueError(
                    f"transformers V4: {name} {tuple(w.shape)} does not fit {key} {tuple(dest.shape)}"
                )
            dest.copy_(w)
            filled.add(key)
    missing = sorted(k for k in set(params) - filled if "rotary_emb" not in k)  # rotary: computed
    if missing:
        raise KeyError(f"transformers V4: parameters not in the checkpoint: {missing}")


def load_tf_model(
    model_dir: str | Path,
    cfg_dict: dict[str, Any],
    cfg: V4Config,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Any:
    """The model with the checkpoint's weights; at a BF16 `dtype` the modules transformers keeps in FP32
    (`_keep_in_fp32_modules_strict`) stay FP32, as `from_pretrained` leaves them."""
    from transformers import DeepseekV4ForCausalLM

    # BF16 holds E4M3 and E2M1 values times power-of-two scales exactly: dequantizing to it loses nothing
    kind = "f32" if dtype == torch.float32 else "bf16"
    weights = load_checkpoint(
        model_dir, cfg, weights=kind, expected=expected_tensors(cfg), skipped=is_skipped
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built at `dtype` on `device`: no FP32 copy of a full-width model
    try:
        with torch.device(device):
            model = DeepseekV4ForCausalLM(hf_config(cfg_dict, cfg))
    finally:
        torch.set_default_dtype(default)
    model = model.eval()
    keep = getattr(model, "_keep_in_fp32_modules_strict", None) or []
    for name, module in model.named_modules():
        if any(f".{k}." in f".{name}." or name.endswith(k) for k in keep):
            module.float()
    copy_weights(model, weights)
    return model


def tf_logits(model: Any, ids: list[int]) -> Tensor:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()
