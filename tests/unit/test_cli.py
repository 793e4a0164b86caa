"""The `dsgraph` command: --version and `inspect --example`."""

from __future__ import annotations

import pytest

from dsgraph.tools.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("dsgraph ")


@pytest.mark.parametrize("platform", ["null", "cpu"])
def test_inspect_example_prints_every_stage(capsys: pytest.CaptureFixture[str], platform: str) -> None:
    assert main(["inspect", "--example", "--tokens", "4", "--platform", platform]) == 0
    out = capsys.readouterr().out
    stages = [
        "==== traced",
        "==== optimized",
        "==== specialized to bucket",
        f"==== lowered and memory-planned on {platform}",
    ]
    positions = [out.index(s) for s in stages]
    assert positions == sorted(positions)
    assert "f32[tokens,64]" in out and "f32[4,64]" in out
    assert "arena" in out and "peak live" in out


def test_inspect_needs_a_source() -> None:
    with pytest.raises(SystemExit, match="give --example or --model"):
        main(["inspect"])


def test_make_tiny_then_inspect_model_decode(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "tiny"
    assert main(["make-tiny", str(out), "--seed", "3"]) == 0
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    capsys.readouterr()
    assert main(["inspect", "--model", str(out), "--step", "decode", "--tokens", "2"]) == 0
    text = capsys.readouterr().out
    traced = text[: text.index("==== optimized")]
    # the whole model: every layer's attention and MoE, Engram, mHC, compressor, indexer, head
    for op_name in ("engram_hash", "hc_pre", "compress", "index_scores", "candidate_mask", "topk_select"):
        assert f"= {op_name}" in traced, op_name
    assert traced.count("= attention") == 6 and traced.count("= moe_experts") == 6
    returned = traced.split("  return ")[-1]
    assert returned.startswith("%") and " logits, " in returned and "caches.swa.5" in returned
    assert "f32[2,256]" in text  # logits of the decode bucket (2 sequences, vocabulary 256)


def test_inspect_a_v4_model_every_step(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """inspect reads the checkpoint's model_type: V4-Flash's step, verify and MTP draft graphs, lowered
    onto cuda without a GPU (V4's compressor, not V4.1's; its window_compress on the linear kernel)."""
    out = tmp_path / "tiny-v4"
    assert (
        main(["make-tiny", str(out), "--model-type", "deepseek_v4", "--set", "num_nextn_predict_layers=1"])
        == 0
    )
    capsys.readouterr()
    for step, name in (
        ("decode", "v4_decode"),
        ("prefill", "v4_prefill"),
        ("verify", "v4_verify"),
        ("draft", "v4_mtp_draft"),
    ):
        args = ["inspect", "--model", str(out), "--step", step, "--tokens", "2", "--platform", "cuda"]
        assert main([*args, "--stage", "lowered"]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"program {name}["), (step, text[:200])
    assert (
        main(["inspect", "--model", str(out), "--step", "decode", "--tokens", "2", "--platform", "cuda"]) == 0
    )
    text = capsys.readouterr().out
    assert "= window_compress" in text and "= compress(" not in text and "= engram_hash" not in text
    assert "window_compress  -> cuda.kernels.cache.window_compress" in text


def test_make_tiny_overrides_and_bad_override(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    out = tmp_path / "t"
    assert main(["make-tiny", str(out), "--set", "sliding_window=6", "--set", "index_topk=4"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["text_config"]["sliding_window"] == 6 and cfg["text_config"]["index_topk"] == 4
    with pytest.raises(SystemExit):
        main(["make-tiny", str(tmp_path / "u"), "--set", "no_equals_sign"])
