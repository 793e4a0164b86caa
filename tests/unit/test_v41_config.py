"""V4.1 config parsing, validation and layer roles (spec model-v41 sections 1, 2 and 10)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dsgraph.models.deepseek_v41.config import ConfigError, load_config, parse_config
from dsgraph.models.deepseek_v41.layers_plan import LayerMode, draft_plans, layer_plans, plans_as_text
from dsgraph.models.deepseek_v41.tiny import tiny_config_dict

SWA, FULL, REINDEX, REUSE = LayerMode.SWA, LayerMode.FULL, LayerMode.REINDEX, LayerMode.REUSE

# The released Flash config, spec section 1.1, written out by hand (independently of
# models/deepseek_v41/flash.py, which test_flash_module_matches checks against it).
FLASH_TEXT: dict[str, Any] = {
    "model_type": "deepseek_v41_text",
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
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "attention_bias": False,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
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
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
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
    "dtype": "bfloat16",
}
FLASH: dict[str, Any] = {
    "model_type": "deepseek_v41",
    "architectures": ["DeepseekV41ForCausalLM"],
    "image_token_id": 129264,
    "pad_token_id": 2,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": [32, 32],
        "expert_dtype": "fp4",
        "activation_scheme": "dynamic",
    },
    "text_config": FLASH_TEXT,
    "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 32},
}


def flash(**text: Any) -> dict[str, Any]:
    d = copy.deepcopy(FLASH)
    d["text_config"].update(text)
    return d


def test_flash_roles_match_spec_table() -> None:
    cfg = parse_config(FLASH)
    plans = layer_plans(cfg.text)
    assert len(plans) == 40
    full = {2: 2, 8: 2, 14: 2, 20: 1}
    reindex = {24, 28, 32, 36}
    for p in plans:
        i = p.index
        if i in (0, 1):
            want = (SWA, 0, -1, -1)
        elif i in full:
            want = (FULL, full[i], i, i)
        elif i in reindex:
            want = (REINDEX, 1, 20, i)
        elif i < 20:
            source = 2 if i < 8 else 8 if i < 14 else 14
            want = (REUSE, 2, source, source)
        else:
            want = (REUSE, 1, 20, max(j for j in (20, 24, 28, 32, 36) if j < i))
        assert (p.mode, p.ratio, p.kv_source, p.topk_source) == want, i
        assert p.is_candidate_source == (i == 20)
        assert p.uses_candidates == (i in reindex)
        assert p.engram_table == {1: 0, 14: 1}.get(i, -1)
        assert (p.rope_theta, p.use_yarn) == ((10000.0, False) if i < 2 else (160000.0, True))
    stages = draft_plans(cfg.text)
    assert [(s.index, s.mode, s.rope_theta, s.is_draft_stage) for s in stages] == [
        (40, SWA, 10000.0, True),
        (41, SWA, 10000.0, True),
        (42, SWA, 10000.0, True),
    ]


def test_flash_fields_parsed() -> None:
    cfg = parse_config(FLASH)
    assert cfg.text.rope_scaling.original_max_position_embeddings == 65536
    assert cfg.text.compress_ratios[:3] == (0, 0, 2) and len(cfg.text.compress_ratios) == 43
    assert (
        cfg.quant is not None and cfg.quant.weight_block_size == (32, 32) and cfg.quant.expert_dtype == "fp4"
    )
    assert cfg.vision_num_hidden_layers == 32 and cfg.image_token_id == 129264
    assert cfg.text.extra == {"model_type": "deepseek_v41_text"}


def test_tiny_roles_match_spec_section_10() -> None:
    cfg = parse_config(tiny_config_dict())
    got = [
        (
            p.mode,
            p.ratio,
            p.kv_source,
            p.topk_source,
            p.is_candidate_source,
            p.uses_candidates,
            p.engram_table,
        )
        for p in layer_plans(cfg.text)
    ]
    assert got == [
        (SWA, 0, -1, -1, False, False, -1),
        (FULL, 2, 1, 1, False, False, 0),
        (REUSE, 2, 1, 1, False, False, 1),
        (FULL, 1, 3, 3, True, False, -1),
        (REINDEX, 1, 3, 4, False, True, -1),
        (REUSE, 1, 3, 4, False, False, -1),
    ]
    assert [p.index for p in draft_plans(cfg.text)] == [6, 7, 8]
    text = plans_as_text(layer_plans(cfg.text))
    assert text.splitlines()[3] == "layer 3 r=1 full kv=3 topk=3 cand=src engram=- rope=160000+yarn"


def test_second_config_with_swa_gap_and_no_candidates() -> None:
    d = tiny_config_dict(
        hidden_size=128,
        num_attention_heads=8,
        o_groups=4,
        num_hidden_layers=9,
        num_nextn_predict_layers=0,
        compress_ratios=[0, 1, 1, 2, 2, 0, 2, 1, 1],
        kv_source_layer_ids=[1, 3, 7],
        index_source_layer_ids=[1, 3, 4, 7],
        candidate_source_layer_id=-1,
        engram_layer_ids=[],
        engram_num_embeddings=[],
    )
    plans = layer_plans(parse_config(d).text)
    assert [(p.mode, p.kv_source, p.topk_source, p.uses_candidates) for p in plans] == [
        (SWA, -1, -1, False),
        (FULL, 1, 1, False),
        (REUSE, 1, 1, False),
        (FULL, 3, 3, False),
        (REINDEX, 3, 4, False),
        (SWA, -1, -1, False),
        (REUSE, 3, 4, False),
        (FULL, 7, 7, False),
        (REUSE, 7, 7, False),
    ]
    assert draft_plans(parse_config(d).text) == ()


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (
            {"compress_ratios": [0, 2, 2, 3, 1, 1, 0, 0, 0]},
            "text_config.compress_ratios[3]",
            "3 is not one of (0, 1, 2)",
        ),
        (
            {"compress_ratios": [0, 2, 2, 1, 1, 1, 0, 0]},
            "text_config.compress_ratios",
            "8 entries, expected 9",
        ),
        (
            {"compress_ratios": [0, 2, 2, 1, 1, 1, 0, 1, 0]},
            "text_config.compress_ratios[7]",
            "DSpark stage 1",
        ),
        (
            {"kv_source_layer_ids": [3], "index_source_layer_ids": [3, 4]},
            "text_config.compress_ratios[1]",
            "latest preceding KV source is none",
        ),
        (
            {"compress_ratios": [0, 2, 2, 2, 1, 1, 0, 0, 0]},
            "text_config.compress_ratios[4]",
            "layer 3 with ratio 2 (expected a preceding KV source of ratio 1)",
        ),
        ({"index_source_layer_ids": [1, 4]}, "text_config.kv_source_layer_ids[1]", "KV source 3 is not in"),
        (
            {"index_source_layer_ids": [0, 1, 3, 4]},
            "text_config.index_source_layer_ids[0]",
            "SWA-only layers cannot be sources",
        ),
        (
            {"candidate_source_layer_id": 4},
            "text_config.candidate_source_layer_id",
            "4 is not -1 or a KV source",
        ),
        (
            {"kv_source_layer_ids": [1, 3, 4], "index_source_layer_ids": [1, 3, 4]},
            "text_config.kv_source_layer_ids",
            "KV source 4 follows candidate_source_layer_id 3",
        ),
        ({"kv_source_layer_ids": [3, 1]}, "text_config.kv_source_layer_ids[1]", "strictly increasing"),
        ({"head_dim": 48}, "text_config.head_dim", "48 is not a multiple of 32"),
        ({"hidden_size": 80}, "text_config.hidden_size", "80 is not a multiple of 32"),
        ({"qk_rope_head_dim": 15}, "text_config.qk_rope_head_dim", "15 is not even"),
        ({"o_groups": 3}, "text_config.o_groups", "3 does not divide num_attention_heads 4"),
        ({"num_key_value_heads": 2}, "text_config.num_key_value_heads", "2 is not 1"),
        ({"index_topk": "3"}, "text_config.index_topk", "'3' is not an integer"),
        ({"hidden_size": True}, "text_config.hidden_size", "True is not an integer"),
        ({"kv_source_layer_ids": [1, "3"]}, "text_config.kv_source_layer_ids[1]", "'3' is not an integer"),
        (
            {"engram_num_embeddings": [252]},
            "text_config.engram_num_embeddings",
            "1 entries, expected one per",
        ),
        (
            {"dspark_target_layer_ids": [3, 4, 6]},
            "text_config.dspark_target_layer_ids[2]",
            "6 is not a backbone layer",
        ),
        (
            {
                "rope_scaling": {
                    "rope_type": "linear",
                    "factor": 16,
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "original_max_position_embeddings": 64,
                }
            },
            "text_config.rope_scaling.rope_type",
            "'linear'",
        ),
        (
            {"scoring_func": "softmax"},
            "text_config.scoring_func",
            "'softmax' is not one of ('sqrtsoftplus',)",
        ),
    ],
)
def test_rule_violations_name_the_field(text: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(tiny_config_dict(**text))
    assert info.value.path == path
    assert message in str(info.value)
    assert str(info.value).startswith(path + ": ")


def test_missing_field_without_a_default_is_named() -> None:
    d = tiny_config_dict()
    del d["text_config"]["rope_scaling"]["factor"]  # rope_scaling's keys have no defaults of their own
    with pytest.raises(ConfigError, match=r"^text_config.rope_scaling.factor: missing \(expected float\)$"):
        parse_config(d)


@pytest.mark.parametrize(
    ("top", "match"),
    [
        ({"model_type": "deepseek_v4"}, "model_type: 'deepseek_v4' is not 'deepseek_v41'"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings: true"),
        ({"pad_token_id": 256}, r"pad_token_id: 256 is outside the vocabulary \[0, 256\)"),
        (
            {"quantization_config": {"scale_fmt": "float"}},
            "quantization_config.scale_fmt: 'float' is not one of",
        ),
        ({"quantization_config": {"weight_block_size": [32]}}, "quantization_config.weight_block_size"),
    ],
)
def test_top_level_errors(top: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(tiny_config_dict(**top))


def test_unknown_fields_kept_and_quant_optional(tmp_path: Path) -> None:
    d = tiny_config_dict(some_new_field=[1, 2])
    d["transformers_version"] = "5.24.0"
    del d["quantization_config"]
    with pytest.warns(UserWarning, match="unknown keys ignored: text_config.some_new_field$"):
        cfg = parse_config(d)
    assert cfg.text.extra == {"some_new_field": [1, 2]}
    assert cfg.extra == {"transformers_version": "5.24.0"}
    assert cfg.quant is None
    (tmp_path / "config.json").write_text(json.dumps(FLASH))
    assert load_config(tmp_path) == load_config(tmp_path / "config.json") == parse_config(FLASH)


def test_quant_config_nested_in_text_config() -> None:
    d = tiny_config_dict()
    d["text_config"]["quantization_config"] = d.pop("quantization_config") | {"expert_dtype": "fp8"}
    cfg = parse_config(d)
    assert cfg.quant is not None and cfg.quant.expert_dtype == "fp8"


def test_flash_module_matches() -> None:
    from dsgraph.models.deepseek_v41.flash import flash_config_dict

    assert flash_config_dict() == FLASH
    assert flash_config_dict(num_hidden_layers=8)["text_config"]["num_hidden_layers"] == 8
    assert FLASH["text_config"]["num_hidden_layers"] == 40  # the copy is fresh
