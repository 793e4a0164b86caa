"""NeMo AutoModel's DeepSeek-V4.1 as the CPU FP32 oracle (spec model-v41 section 11).

Only tests under tests/oracle may import this module (NeMo is the independent reference, never a
dependency of dsgraph). Test modules call `pytest.importorskip("nemo_automodel")` before importing
it. Everything runs on CPU in FP32 with NeMo's torch/eager code paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from nemo_automodel.components.models.common import BackendConfig
from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41Config
from nemo_automodel.components.models.deepseek_v41.dspark import (
    DeepseekV41DSparkBackbone,
    DeepseekV41DSparkModel,
)
from nemo_automodel.components.models.deepseek_v41.model import DeepseekV41ForCausalLM
from nemo_automodel.components.speculative.dspark.common import create_noise_embed
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

# NeMo's class default (tilelang attention, hybridep dispatch) is GPU-only; these are its CPU paths.
CPU_BACKEND = dict(
    attn="eager",
    linear="torch",
    rms_norm="torch_fp32",
    rope="torch",
    rope_fusion=False,
    experts="torch",
    dispatcher="torch",
    enable_hf_state_dict_adapter=True,
    gate_precision="float32",
)

_CacheKey = tuple[str, str, str, tuple[tuple[str, int, int], ...]]
_MODEL_CACHE: dict[_CacheKey, torch.nn.Module] = {}


def select_all_overrides(max_tokens: int) -> dict[str, int]:
    """Text overrides that make every top-k select everything up to `max_tokens` positions.

    Random weights give exact ties in the indexer scores, and torch.topk breaks them depending on
    row width; with nothing left out, prefix runs and full runs agree to FP32 rounding.
    """
    return {"index_topk": max_tokens, "candidate_topk_blocks": max_tokens}


def _read_config_json(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"config.json not found in checkpoint directory {model_dir}")
    raw = json.loads(path.read_text())
    if not isinstance(raw.get("text_config"), dict):
        raise ValueError(
            f"{path}: expected a nested 'text_config' object, found {type(raw.get('text_config'))}"
        )
    return raw


def nemo_config(model_dir: str | Path, text_overrides: Mapping[str, Any] | None = None) -> DeepseekV41Config:
    """NeMo config from the checkpoint's config.json plus `text_overrides`, forced to FP32."""
    raw = _read_config_json(Path(model_dir))
    text = {**raw.pop("text_config"), **dict(text_overrides or {})}
    text["dtype"] = "float32"
    # Released quantisation metadata describes the files, not the in-memory oracle (dequantised).
    text.pop("quantization_config", None)
    raw.pop("quantization_config", None)
    raw.pop("model_type", None)
    raw["dtype"] = "float32"
    raw.pop("torch_dtype", None)
    vision = raw.pop("vision_config", None) or {"num_hidden_layers": 0}
    return DeepseekV41Config(text_config=text, vision_config=vision, **raw)


def nemo_tokenizer(model_dir: str | Path, config: DeepseekV41Config) -> PreTrainedTokenizerFast:
    """Fast tokenizer from tokenizer.json, with bos/eos/pad named by the config's ids."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer.json not found in checkpoint directory {Path(model_dir)}")
    fast = PreTrainedTokenizerFast(tokenizer_file=str(path))
    names = {}
    for role in ("bos", "eos", "pad"):
        token_id = getattr(config, f"{role}_token_id")
        token = fast.convert_ids_to_tokens(token_id) if token_id is not None else None
        if token is None:
            raise ValueError(f"config.json {role}_token_id={token_id} has no token in {path}")
        names[f"{role}_token"] = token
    fast.add_special_tokens(names)
    return fast


def _read_released_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, value in load_file(str(file)).items():
            if name in tensors:
                raise ValueError(f"tensor {name} appears in more than one file (second: {file.name})")
            tensors[name] = value
    return tensors


def _load_released_weights(model: torch.nn.Module, model_dir: Path) -> None:
    """Dequantise the released files through the model's NeMo adapter and load them with strict keys.

    The adapter keeps only its own part of the file (the backbone drops `mtp.*`, the draft keeps
    `mtp.*` plus the shared `embed`/`head`); every key the model has must come from the file.
    """
    native = model.state_dict_adapter.from_hf(_read_released_tensors(model_dir))
    expected = set(model.state_dict())
    missing = sorted(expected - set(native))
    unexpected = sorted(set(native) - expected)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {model_dir} does not match NeMo's model: missing {missing[:10]} "
            f"({len(missing)} total), unexpected {unexpected[:10]} ({len(unexpected)} total)"
        )
    state = model.state_dict()
    for name, value in native.items():
        if tuple(value.shape) != tuple(state[name].shape):
            expected_shape = tuple(state[name].shape)
            raise ValueError(
                f"tensor {name}: shape {tuple(value.shape)} in checkpoint, NeMo expects {expected_shape}"
            )
    model.load_state_dict({k: v.to(torch.float32) for k, v in native.items()}, strict=True)


def _cache_key(kind: str, model_dir: Path, overrides: Mapping[str, Any] | None) -> _CacheKey:
    # File stamps guard against a directory rewritten in place by a test within the session.
    stamps = tuple(
        (p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(model_dir.iterdir()) if p.is_file()
    )
    return kind, str(model_dir.resolve()), json.dumps(dict(overrides or {}), sort_keys=True), stamps


def load_nemo_model(
    model_dir: str | Path, text_overrides: Mapping[str, Any] | None = None
) -> DeepseekV41ForCausalLM:
    """NeMo's `DeepseekV41ForCausalLM` with a checkpoint directory's weights, CPU FP32, eval mode.

    Cached per (directory, overrides, file stamps) for the test session; callers must not modify
    the returned model.
    """
    directory = Path(model_dir)
    key = _cache_key("target", directory, text_overrides)
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]  # type: ignore[return-value]
    config = nemo_config(directory, text_overrides)
    tokenizer = nemo_tokenizer(directory, config)
    model = DeepseekV41ForCausalLM(config, backend=BackendConfig(**CPU_BACKEND), tokenizer=tokenizer)
    _load_released_weights(model, directory)
    model.eval()
    _MODEL_CACHE[key] = model
    return model


def nemo_logits(model: DeepseekV41ForCausalLM, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), vocab] FP32 of one prompt (batch 1, positions 0..len-1)."""
    if not ids:
        raise ValueError("nemo_logits: ids must hold at least one token")
    vocab = model.config.text_config.vocab_size
    if min(ids) < 0 or max(ids) >= vocab:
        raise ValueError(f"nemo_logits: token ids must be in [0, {vocab}), got min {min(ids)} max {max(ids)}")
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long))
    return out.logits[0].to(torch.float32)


def load_nemo_dspark(
    model_dir: str | Path, text_overrides: Mapping[str, Any] | None = None
) -> DeepseekV41DSparkModel:
    """NeMo's 3-stage DSpark drafter with the checkpoint's `mtp.*`, `embed` and `head`, CPU FP32."""
    directory = Path(model_dir)
    key = _cache_key("dspark", directory, text_overrides)
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]  # type: ignore[return-value]
    text = nemo_config(directory, text_overrides).text_config
    draft = DeepseekV41DSparkModel(
        text, backend=BackendConfig(**CPU_BACKEND), num_anchors=1, enable_confidence_head=True
    )
    _load_released_weights(draft, directory)
    draft.eval()
    _MODEL_CACHE[key] = draft
    return draft


def nemo_target_features(model: DeepseekV41ForCausalLM, ids: list[int]) -> torch.Tensor:
    """DSpark target features [len(ids), len(dspark_target_layer_ids) * hidden] FP32.

    For each target layer: the residual streams entering it (after its Engram, before its attention
    mHC; NeMo's capture point is the attention mHC module's input), averaged over the streams.
    """
    text = model.config.text_config
    captured: dict[int, torch.Tensor] = {}
    modules = model.get_dspark_target_feature_modules(list(text.dspark_target_layer_ids))
    hooks = [
        module.register_forward_pre_hook(lambda _m, args, k=k: captured.__setitem__(k, args[0]))
        for k, module in enumerate(modules)
    ]
    try:
        nemo_logits(model, ids)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([captured[k][0].float().mean(dim=1) for k in range(len(modules))], dim=-1)


def nemo_dspark(
    model: DeepseekV41ForCausalLM,
    draft: DeepseekV41DSparkModel,
    ids: list[int],
    previous_ids: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """One drafting round anchored at the last of `ids` (position a = len(ids) - 1).

    The block [ids[a], NOISE x (block-1)] at positions a..a+block-1 attends to the target features
    of positions a-window..a-1 and to itself. Slot k's Markov correction reads the token before it:
    `previous_ids` = [ids[a], d_0, ..., d_{block-2}] when given (teacher forcing); otherwise the
    drafts are chosen greedily, slot by slot.

    Returns:
        (draft logits [block, vocab] FP32, confidence logits [block] FP32, previous ids used).
        NeMo's confidence head reads the post-norm state (spec 7.2: the released weights expect
        pre-norm), so confidences are only comparable to an engine run in the same mode.
    """
    block = model.config.text_config.dspark_block_size
    features = nemo_target_features(model, ids)
    if previous_ids is not None:
        if len(previous_ids) != block or previous_ids[0] != ids[-1]:
            raise ValueError(
                f"nemo_dspark: previous_ids must hold {block} ids starting with the anchor {ids[-1]}, "
                f"got {previous_ids}"
            )
        logits, confidence = _dspark_block(draft, ids, features, previous_ids)
        return logits, confidence, list(previous_ids)
    chosen = [ids[-1]] * block
    for k in range(block):
        # Slot k depends on previous id k only, so later placeholder ids do not affect it.
        logits, confidence = _dspark_block(draft, ids, features, chosen)
        if k + 1 < block:
            chosen[k + 1] = int(logits[k].argmax())
    return logits, confidence, chosen


def _dspark_block(
    draft: DeepseekV41DSparkModel, ids: list[int], features: torch.Tensor, previous_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    text = draft.config
    context = len(ids)
    anchor = torch.tensor([[context - 1]])
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        noise = create_noise_embed(
            draft.embed_tokens,
            input_ids,
            anchor,
            torch.ones_like(anchor, dtype=torch.bool),
            mask_token_id=text.dspark_noise_token_id,
            block_size=text.dspark_block_size,
        )
        mask = draft.build_attention_mask(
            anchor, torch.ones_like(anchor, dtype=torch.bool), context, noise.dtype
        )
        out = DeepseekV41DSparkBackbone.forward(
            draft,
            noise,
            features[None].to(noise.dtype),
            position_ids=draft.build_position_ids(anchor, context),
            attention_mask=mask,
            previous_token_ids=torch.tensor([previous_ids]),
            enable_confidence_head=True,
        )
        logits = draft.compute_logits(out.normalized_hidden_states) + out.transition_logits.float()
    return logits[0], out.confidence_pred[0].float()


# NeMo's NVFP4 scale is `(amax / 6).to(float8_e4m3fn)` with no clamp: it relies on the cast saturating at
# 448, which torch's CPU cast does from 2.13 on; earlier versions (2.11 on the GPU machine) return NaN.
E4M3_CAST_SATURATES = torch.tensor([1000.0]).to(torch.float8_e4m3fn).float().item() == 448.0


def nemo_comparable(x: torch.Tensor, fmt: str, group: int) -> torch.Tensor:
    """`x` with the groups NeMo cannot quantize on this torch (NVFP4 amax > 6 * 448 without a
    saturating cast) set to zero, so a comparison with NeMo covers every group it handles."""
    if fmt not in ("nvfp4", "nvfp4_g16") or E4M3_CAST_SATURATES:
        return x
    g = x.unflatten(-1, (-1, group))
    too_big = g.float().abs().amax(-1, keepdim=True) > 6 * 448
    return torch.where(too_big, torch.zeros_like(g), g).flatten(-2)
