"""config.json fields missing take the reference config class's defaults (config_defaults.py), unknown
keys warn once, wrong values still fail naming the field."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest

from dsgraph.models.deepseek_v41.config import ConfigError, TextConfig, parse_config
from dsgraph.models.deepseek_v41.config_defaults import TEXT_DEFAULTS, TOP_DEFAULTS
from dsgraph.models.deepseek_v41.tiny import tiny_config_dict


def _quiet(d: dict) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the reference class's own keys never warn
        return parse_config(d)


def test_every_text_field_has_a_default() -> None:
    names = {f.name for f in dataclasses.fields(TextConfig)} - {"extra"}
    assert names == set(TEXT_DEFAULTS)


def test_an_empty_text_config_is_the_released_flash_configuration() -> None:
    cfg = _quiet({"model_type": "deepseek_v41", "text_config": {}})
    t = cfg.text
    assert (t.hidden_size, t.num_hidden_layers, t.n_routed_experts, t.vocab_size) == (5120, 40, 384, 129280)
    assert len(t.compress_ratios) == 43 and t.engram_num_embeddings == (384006168, 384016682)
    assert (cfg.eos_token_id, cfg.bos_token_id, cfg.image_token_id) == (1, 0, 129264)
    no_engram = _quiet({"model_type": "deepseek_v41", "text_config": {"engram_layer_ids": []}})
    assert no_engram.text.engram_num_embeddings == ()


@pytest.mark.parametrize("name", ["scoring_func", "topk_method", "norm_topk_prob", "hc_eps", "swiglu_limit"])
def test_a_missing_field_takes_the_default(name: str) -> None:
    d = tiny_config_dict()
    full = parse_config(copy.deepcopy(d))
    del d["text_config"][name]
    assert getattr(_quiet(d).text, name) == getattr(full.text, name) == _as_field(TEXT_DEFAULTS[name])


def _as_field(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def test_defaults_are_checked_like_given_values() -> None:
    d = tiny_config_dict()
    del d["text_config"]["compress_ratios"]  # the released 43-entry schedule does not fit 6 + 3 layers
    with pytest.raises(ConfigError, match=r"^text_config.compress_ratios: 43 entries, expected 9"):
        parse_config(d)
    bad = tiny_config_dict(scoring_func="softmax")
    with pytest.raises(ConfigError, match=r"^text_config.scoring_func: 'softmax' is not one of"):
        parse_config(bad)
    with pytest.raises(ConfigError, match=r"^text_config.hc_eps: 'small' is not a finite number"):
        parse_config(tiny_config_dict(hc_eps="small"))


def test_unknown_keys_warn_once_naming_them() -> None:
    d = tiny_config_dict(brand_new=1, use_cache=True, initializer_range=0.02)
    d["also_new"] = "x"
    d["transformers_version"] = "5.24.0"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parse_config(d)
    assert [str(w.message) for w in caught] == [
        "config.json: unknown keys ignored: also_new, text_config.brand_new"
    ]


def test_the_table_is_the_reference_classes_defaults() -> None:
    ref = pytest.importorskip("nemo_automodel.components.models.deepseek_v41.config")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text, top = ref.DeepseekV41TextConfig(), ref.DeepseekV41Config()
    for name, value in TEXT_DEFAULTS.items():
        got = getattr(text, name)
        if name == "rope_scaling":  # transformers copies rope_theta into it
            got = {k: v for k, v in got.items() if k != "rope_theta"}
        assert _plain(got) == value, name
    for name, value in TOP_DEFAULTS.items():
        assert _plain(getattr(top, name)) == value, name


def _plain(value: object) -> object:
    """transformers turns the dtype string into a torch.dtype; config.json holds its name."""
    return str(value).removeprefix("torch.") if type(value).__name__ == "dtype" else value


def test_a_save_pretrained_style_diff_config_loads() -> None:
    """transformers' save_pretrained leaves out fields equal to the class defaults; NeMo loads the
    result, and so must we, to the same configuration."""
    ref = pytest.importorskip("nemo_automodel.components.models.deepseek_v41.config")
    d = tiny_config_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defaults = ref.DeepseekV41TextConfig().to_dict()
        nemo = ref.DeepseekV41Config(**copy.deepcopy(d))
    diffed = copy.deepcopy(d)
    diffed["text_config"] = {k: v for k, v in d["text_config"].items() if defaults.get(k, object()) != v}
    assert "scoring_func" not in diffed["text_config"]  # the field the loader used to fail on
    assert len(diffed["text_config"]) < len(d["text_config"])
    cfg = _quiet(diffed)
    assert cfg == parse_config(d)
    assert cfg.text.scoring_func == nemo.text_config.scoring_func
