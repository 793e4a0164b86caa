"""Speculative decoding with the V4 MTP layer end to end (cpu, tiny V4 checkpoints, `speculative="mtp"`).

Exactness: the tokens of greedy and seeded requests equal a run without drafting, with deterministic
verification (every token the target's own seeded draw; plain and overlapped loop) and with exact
speculative sampling (greedy requests). Acceptance: on a checkpoint built so that the MTP layer's draft
is the target's own next-token distribution, nearly every draft is accepted, and the tokens still equal
the run without drafting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dsgraph.models.deepseek_v4.config import parse_config
from dsgraph.models.deepseek_v4.tiny import make_tiny, quantize_weights, random_weights, tiny_config_dict
from dsgraph.models.deepseek_v41.checkpoint_io import write_checkpoint
from dsgraph.models.deepseek_v41.tokenizer_fixture import fixture_tokenizer
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [40 + 3 * i for i in range(11)]]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=8, ignore_eos=True),
]
BASE: dict[str, Any] = dict(max_model_len=64, max_num_seqs=3, numerics="reference")
MTP = {"num_nextn_predict_layers": 1}


def _tokens(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple[int, ...]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(make_tiny(tmp_path_factory.mktemp("v4-mtp") / "tiny", seed=0, overrides=MTP))


@pytest.fixture(scope="module")
def reference(mtp_dir: Path) -> list[tuple[int, ...]]:
    return _tokens(LLM(mtp_dir, speculative="off", **BASE), PROMPTS, PARAMS)


@pytest.mark.parametrize("overlap", ["off", "on"])  # "on": the overlapped loop (runtime/spec_overlap.py)
def test_deterministic_drafting_emits_the_tokens_of_no_drafting(mtp_dir, reference, overlap: str) -> None:  # type: ignore[no-untyped-def]
    kw = dict(deterministic=True, verify_schedule="fixed", overlap=overlap)
    llm = LLM(mtp_dir, speculative="mtp", **kw, **BASE)  # type: ignore[arg-type]
    assert (llm.engine.overlap is not None) == (overlap == "on")
    assert _tokens(llm, PROMPTS, PARAMS) == reference
    stats = llm.engine.spec_stats()
    assert stats is not None and stats["verified_tokens"] > 0


def test_exact_verification_keeps_greedy_tokens(mtp_dir: Path, reference) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(mtp_dir, speculative="mtp", verify_schedule="fixed", **BASE)
    assert _tokens(llm, PROMPTS[:2], PARAMS[:2]) == reference[:2]


def _self_drafting(root: Path) -> Path:
    """A checkpoint whose target is a bigram model and whose MTP layer computes the same bigram.

    Every sublayer's output projection (attention `wo_b`, experts' and shared expert's `w2`) is zero, so
    the residual streams stay multiples of the token's embedding e and the target's logits at the row of
    token t are head(norm(e_t)). The MTP layer gets the same zeros, `eh_proj` = [0 | I] and enorm = 1 (its
    block input is e_t / rms(e_t)) and the backbone's final norm, so its logits for anchor t are
    head(norm(e_t)) too: the draft is the target's next-token distribution, up to rounding."""
    cfg_dict = tiny_config_dict(**MTP)
    cfg = parse_config(cfg_dict)
    w = random_weights(cfg, seed=4)
    for name in w:
        if name.endswith(("attn.wo_b.weight", "w2.weight")):
            w[name] = torch.zeros_like(w[name])
    h = cfg.text.hidden_size
    w["mtp.0.eh_proj.weight"] = torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1)
    w["mtp.0.enorm.weight"] = torch.ones(h)
    w["mtp.0.norm.weight"] = w["norm.weight"].clone()
    out = write_checkpoint(root, quantize_weights(cfg, w), cfg_dict)
    fixture_tokenizer("tiny", cfg.text.vocab_size).save(str(out / "tokenizer.json"))
    return out


def test_a_draft_equal_to_the_target_is_accepted(tmp_path: Path) -> None:
    root = _self_drafting(tmp_path / "self-drafting")
    greedy = [SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)] * 2
    want = _tokens(LLM(root, speculative="off", **BASE), PROMPTS[:2], greedy)
    llm = LLM(root, speculative="mtp", verify_schedule="fixed", **BASE)
    assert _tokens(llm, PROMPTS[:2], greedy) == want
    stats = llm.engine.spec_stats()
    assert stats is not None and stats["verified_tokens"] >= 6
    assert stats["accepted_tokens"] >= 0.9 * stats["verified_tokens"]
