"""Prefill truncation on the host: the rows a truncated step keeps, the start-up rule on KEEP (the error
names both numbers), and the EngineConfig / CLI fields."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from dsgraph.models.deepseek_v41.config import parse_config
from dsgraph.models.deepseek_v41.flash import flash_config_dict
from dsgraph.models.deepseek_v41.truncation import check_truncatable, decoder_start
from dsgraph.runtime.engine_config import EngineConfig, TruncationConfig
from dsgraph.runtime.prefill_truncation import max_backtrack, min_keep_tokens, resolve_keep, truncated_inputs
from dsgraph.tools.engine_args import add_engine_args, engine_kwargs


def _step() -> dict[str, np.ndarray]:
    """Sequence 0: a decode row at position 50; sequence 1: prompt chunk 10..19; then one padding row."""
    i32 = np.int32
    return {
        "positions": np.array([50, *range(10, 20), 0], i32),
        "seq_ids": np.array([0] + [1] * 10 + [-1], i32),
        "seq_start": np.array([50, 10], i32),
        "seq_end": np.array([51, 20], i32),
        "seq_window_start": np.array([0, 4], i32),
        "seq_slot": np.array([3, 1], i32),
        "sample_rows": np.array([0, 10], i32),
    }


def test_compact_keeps_the_suffix_and_renumbers_sample_rows() -> None:
    out = truncated_inputs(_step(), np.array([0, 16], np.int32), "compact", 8)
    assert out is not None
    assert out["kept_rows"].tolist() == [0, 7, 8, 9, 10]
    assert out["kept_positions"].tolist() == [50, 16, 17, 18, 19]
    assert out["kept_seq_ids"].tolist() == [0, 1, 1, 1, 1]
    assert out["seq_decoder_start"].tolist() == [50, 16]
    assert out["seq_decoder_window_start"].tolist() == [0, 16]
    assert out["sample_rows"].tolist() == [0, 4]
    # the encoder's inputs are those of the plain step
    assert out["positions"].tolist() == _step()["positions"].tolist()


def test_mask_only_narrows_the_decoder_window() -> None:
    out = truncated_inputs(_step(), np.array([0, 16], np.int32), "mask", 8)
    assert out is not None and "kept_rows" not in out
    assert out["seq_decoder_window_start"].tolist() == [0, 16]
    assert out["sample_rows"].tolist() == [0, 10]


def test_a_step_that_truncates_nothing_runs_the_plain_graph() -> None:
    # no row's window reaches below the kept suffix (the window start is already 4): nothing to cut
    assert truncated_inputs(_step(), np.array([0, 4], np.int32), "compact", 8) is None
    assert truncated_inputs(_step(), np.array([0, 0], np.int32), "mask", 8) is None


def test_a_chunk_of_kept_rows_still_narrows_windows_reaching_below_the_suffix() -> None:
    """Suffix from 7: every row of the chunk 10..19 is kept, but rows 10..13 (window 8) would read
    positions 4..6, which the decoder did not run on (the L1 ring check catches that)."""
    out = truncated_inputs(_step(), np.array([0, 7], np.int32), "compact", 8)
    assert out is not None
    assert out["kept_rows"].tolist() == list(range(11))
    assert out["seq_decoder_window_start"].tolist() == [0, 7]
    assert out["seq_decoder_start"].tolist() == [50, 10]
    assert truncated_inputs(_step(), np.array([0, 7], np.int32), "compact", 4) is None  # window 4: 7..


def test_a_truncated_sample_row_is_an_error() -> None:
    with pytest.raises(ValueError, match="sample row 10 is a truncated row"):
        truncated_inputs(_step(), np.array([0, 25], np.int32), "compact", 8)


def test_keep_rule_names_window_and_backtrack() -> None:
    text = parse_config(flash_config_dict()).text
    assert (text.sliding_window, max_backtrack(text)) == (128, 6)
    assert min_keep_tokens(text) == 134 and resolve_keep(text, None) == 134
    assert resolve_keep(text, 140) == 140
    with pytest.raises(ValueError, match=r"133 is below sliding_window \(128\) \+ maximum backtrack \(6\)"):
        resolve_keep(text, 133)
    # a shorter draft length lowers the backtrack: 128 + 3 + 1
    assert min_keep_tokens(text, draft_len=3) == 132


def test_v41_decoder_starts_at_the_last_kv_source() -> None:
    text = parse_config(flash_config_dict()).text
    assert decoder_start(text) == 20
    check_truncatable(text, tuple(text.dspark_target_layer_ids))
    with pytest.raises(ValueError, match="dspark_target_layer_ids"):
        check_truncatable(text, (10, 38))


def test_engine_config_fields_are_validated() -> None:
    assert EngineConfig().truncation.mode == "off"  # the exact default
    with pytest.raises(
        ValueError, match=r"EngineConfig.truncation.mode = 'on' \(option prefill_truncation\)"
    ):
        EngineConfig.from_flat(prefill_truncation="on")
    with pytest.raises(
        ValueError, match=r"EngineConfig.truncation.keep_tokens = 0 \(option prefill_keep_tokens\)"
    ):
        EngineConfig.from_flat(prefill_truncation="compact", prefill_keep_tokens=0)


def test_cli_flags_reach_the_engine_config() -> None:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    kw = engine_kwargs(p.parse_args(["--prefill-truncation", "compact", "--prefill-keep-tokens", "140"]))
    config = EngineConfig.from_flat(**kw)
    assert config.truncation == TruncationConfig("compact", 140)
    assert engine_kwargs(p.parse_args([]))["prefill_truncation"] == "off"
