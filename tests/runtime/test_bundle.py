"""Ahead-of-time bundles (runtime/bundle/, docs/bundle.md) on the tiny model on cpu: `dsgraph compile`
writes one, a start from it traces and lowers nothing and gives a cold start's tokens and log-probs bit
for bit, and a bundle that does not fit (edited manifest, other versions, other options or cluster shape,
a changed or missing file) is refused with every mismatch listed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dsgraph import LLM, EngineConfig, SamplingParams, Session
from dsgraph.graph import trace
from dsgraph.runtime import session as session_module
from dsgraph.runtime.bundle.checks import BundleMismatchError
from dsgraph.runtime.bundle.load import open_bundle
from dsgraph.tools import cli
from dsgraph.tools.generate_cmd import default_model_dir
from dsgraph.tools.inspect_cmd import example_graph

FLAGS = ["--max-model-len", "128", "--max-num-seqs", "2", "--max-num-batched-tokens", "8"]
KW = {"max_model_len": 128, "max_num_seqs": 2, "max_num_batched_tokens": 8}
CONFIG = EngineConfig.from_flat(**KW)
# the first prompt takes two prefill chunks of 8 rows; with the second the steps hold 2 sequences
PROMPTS = [list(range(5, 16)), [40, 41, 3]]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "tiny"
    assert cli.main(["compile", "--out", str(out), *FLAGS]) == 0
    return out


def _edited(bundle: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    copy = tmp_path / "edited"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(copy, manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _refusal(path: Path, config: EngineConfig = CONFIG, ep: int = 1) -> list[str]:
    with pytest.raises(BundleMismatchError) as info:
        open_bundle(path).check(config, default_model_dir(), ep)
    assert "nothing was rebuilt" in str(info.value)
    return info.value.problems


def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("traced or lowered at a bundle start")

    monkeypatch.setattr(trace.Tracer, "__init__", refuse)
    monkeypatch.setattr(session_module, "lower", refuse)
    with pytest.raises(AssertionError, match="traced"):  # the patch does stop tracing
        example_graph()


def test_a_bundle_start_gives_a_cold_starts_outputs_bit_for_bit(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = SamplingParams(temperature=0, max_tokens=5, logprobs=2, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    cold = LLM(**KW).generate(prompts, params)
    _no_tracing(monkeypatch)
    llm = LLM(bundle=str(bundle), **KW)
    warm = llm.generate(prompts, params)
    session = llm.engine.session
    assert session.programs_built == 0 and session.bundle.programs_loaded > 0
    for c, w in zip(cold, warm, strict=True):
        assert w.outputs[0].token_ids == c.outputs[0].token_ids
        assert w.outputs[0].logprobs == c.outputs[0].logprobs  # every float equal
        assert w.outputs[0].cumulative_logprob == c.outputs[0].cumulative_logprob


def _logits(session: Session) -> list[torch.Tensor]:
    seq = session.open_sequence()
    out = [session.run(session.new_step().add(seq, PROMPTS[1], logits="all").build())]
    for _ in range(2):
        out.append(session.run(session.new_step().add(seq, [int(out[-1][-1].argmax())]).build()))
    return out


def test_session_load_reads_the_bundle_and_matches_a_traced_session(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cold = _logits(Session.from_checkpoint(None, CONFIG))
    _no_tracing(monkeypatch)
    loaded = Session.load(bundle)  # the checkpoint and options it was compiled for
    warm = _logits(loaded)
    assert loaded.programs_built == 0
    assert all(torch.equal(c, w) for c, w in zip(cold, warm, strict=True))


def test_an_edited_manifest_is_refused(bundle: Path, tmp_path: Path) -> None:
    def drop_bucket(root: Path, m: dict) -> None:
        m["buckets"]["step"].pop("tokens8-seqs2-outs8")

    problems = _refusal(_edited(bundle, tmp_path, drop_bucket))
    assert any(p.startswith("manifest: its checksum does not match") for p in problems)


def test_a_bundle_of_other_versions_options_and_cluster_shape_lists_every_mismatch(
    bundle: Path, tmp_path: Path
) -> None:
    def other_torch(root: Path, m: dict) -> None:
        m["environment"]["torch"] = "2.0.0"

    path = _edited(bundle, tmp_path, other_torch)
    problems = _refusal(path, EngineConfig.from_flat(**{**KW, "max_model_len": 256}), ep=2)
    text = "\n".join(problems)
    assert "torch: torch version is '2.0.0' in the bundle" in text
    assert "manifest: its checksum" in text
    assert "max_model_len: the bundle was compiled with 128, this run asks for 256" in text
    assert "run with --max-model-len 128" in text
    assert "ep: the bundle is for an expert-parallel group of 1 ranks, this run has 2" in text


def test_a_changed_or_missing_bucket_file_is_refused(bundle: Path, tmp_path: Path) -> None:
    def tamper(root: Path, m: dict) -> None:
        (root / "graphs/step/tokens4-seqs2-outs4.json.gz").write_bytes(b"\x1f\x8b not a graph")
        (root / "graphs/step/tokens8-seqs2-outs8.json.gz").unlink()

    path = _edited(bundle, tmp_path, tamper)
    problems = [p for p in _refusal(path) if p.startswith("file ")]
    assert problems == [
        "file graphs/step/tokens4-seqs2-outs4.json.gz: its sha256 differs from the manifest's (changed or "
        "damaged); compile a new bundle on this machine with `dsgraph compile` (docs/bundle.md)",
        "file graphs/step/tokens8-seqs2-outs8.json.gz: missing; compile a new bundle on this machine with "
        "`dsgraph compile` (docs/bundle.md)",
    ]


def test_a_bucket_beyond_the_bundle_is_refused_not_lowered(bundle: Path) -> None:
    with pytest.raises(BundleMismatchError, match="no step bucket tokens16-seqs1-outs1"):
        open_bundle(bundle).program("step", "tokens16-seqs1-outs1", "cpu")


def test_generate_with_a_bundle_of_other_options_says_what_to_do(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(["generate", "--bundle", str(bundle), "--max-num-seqs", "4", "--max-model-len", "128"]) == 2
    )
    err = capsys.readouterr().err
    assert "2 mismatches" in err and "run with --max-num-seqs 2" in err
    assert "run with --max-num-batched-tokens 8" in err


def test_inspect_describes_the_bundle(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", "--bundle", str(bundle)]) == 0
    text = capsys.readouterr().out
    assert "buckets step: 19," in text  # tokens 1..8 x seqs 1..2 x outs 1..tokens
    assert "tokens8-seqs2-outs4" in text and "arena" in text
    assert "kernels: none (cpu" in text and "torch 2." in text and "max_num_batched_tokens=8" in text
    assert cli.main(["inspect", "--bundle", str(bundle), "--program", "step/tokens2-seqs2-outs1"]) == 0
    program = capsys.readouterr().out
    assert program.startswith("program v41_step[") and "seqs=2" in program and "memory plan" in program
