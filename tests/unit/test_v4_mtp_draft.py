"""Drafting with the V4 MTP layer (models/deepseek_v4/mtp_draft.py) on the tiny checkpoint, CPU FP32.

The draft pass reads two rings the target step writes (each row's hidden state, and the MTP block's keys);
its distribution must equal the MTP graph (`trace_mtp`, checked against an independent reference in
tests/oracle/test_v4_mtp_vs_reference.py) run over the whole sequence at once, with each token paired with
the previous position's hidden state. The prompt runs in chunks next to another request, so the rings are
read across steps, across a wrap-around and per slot. Also: the `speculative` option's errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsgraph.graph.passes import specialize
from dsgraph.models.deepseek_v4.checkpoint_load import load_weights
from dsgraph.models.deepseek_v4.config import load_config
from dsgraph.models.deepseek_v4.model import build_model
from dsgraph.models.deepseek_v4.mtp import mtp_cache_types, trace_mtp
from dsgraph.models.deepseek_v4.tiny import make_tiny
from dsgraph.models.deepseek_v41.config import parse_config as parse_v41
from dsgraph.models.deepseek_v41.tiny import tiny_config_dict as tiny_v41
from dsgraph.models.interface import REFERENCE, DraftRequest, default_geometry, weight_types
from dsgraph.platform.cpu.interpret import run_program
from dsgraph.platform.registry import lower
from dsgraph.runtime.engine_config import ConfigError, EngineConfig, SpeculativeConfig
from dsgraph.runtime.spec_draft import DraftRunner
from dsgraph.runtime.spec_setup import SpecSetup
from dsgraph.runtime.step_runner import StepRunner

PROMPT = [3 + (i * 37) % 250 for i in range(20)]
OTHER = [7 + (i * 53) % 240 for i in range(9)]
ANCHOR = 42


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("v4-mtp-draft")
    return {
        "mtp": Path(make_tiny(base / "mtp", seed=3, overrides={"num_nextn_predict_layers": 1})),
        "plain": Path(make_tiny(base / "plain", seed=3)),
    }


def _reference(model, weights, tokens: list[int], hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """`trace_mtp` over all rows in one chunk: log-probs [rows, V]."""
    n = len(tokens)
    graph = trace_mtp(model, weight_types(weights, backbone_only=False))
    prog = lower(specialize(graph, {"slots": 1, "tokens": n, "seqs": 1, "outs": n}), "cpu")
    i32 = torch.int32
    step = {
        "token_ids": torch.tensor(tokens, dtype=i32),
        "positions": torch.arange(n, dtype=i32),
        "seq_ids": torch.zeros(n, dtype=i32),
        "seq_slot": torch.zeros(1, dtype=i32),
        "seq_start": torch.zeros(1, dtype=i32),
        "seq_end": torch.tensor([n], dtype=i32),
        "seq_window_start": torch.zeros(1, dtype=i32),
        "sample_rows": torch.arange(n, dtype=i32),
        "hidden": hidden,
    }
    args = {f"weights.{k}": v for k, v in weights.items()}
    args |= {
        f"caches.{k}": torch.zeros((1, *t.shape[1:]), dtype=torch.uint8)
        for k, t in mtp_cache_types(model).items()
    }
    args |= {f"step.{k}": v for k, v in step.items()}
    return torch.log_softmax(run_program(prog, args)["logits"], dim=-1)


def test_the_draft_equals_the_mtp_layer_over_the_whole_sequence(roots: dict[str, Path]) -> None:
    cfg = load_config(roots["mtp"])
    weights = load_weights(roots["mtp"], cfg, REFERENCE, None)
    model = build_model(cfg, REFERENCE, default_geometry(cfg.text, 64, page_size=8), dspark=True)
    runner = StepRunner(model, weights, num_slots=2, num_pages=16, debug=True)
    runner.add(0)
    runner.add(1)
    hidden, start = [], 0
    for n, (a, b) in zip((6, 9, 5), ((0, 4), (4, 9), (9, 9)), strict=True):
        chunks = [(0, PROMPT[start : start + n])] + ([(1, OTHER[a:b])] if b > a else [])
        runner.step(chunks)
        hidden.append(runner.last_debug["mtp.hidden"][:n])  # request 0's rows come first
        start += n
    assert model.geo.ring_len < len(PROMPT)  # the rings wrapped
    drafter = DraftRunner(runner.session, weights, capture=False)
    slots = [runner.requests[r].slot for r in (0, 1)]
    out = drafter.run(
        [
            DraftRequest(ANCHOR, len(PROMPT), slots[0], temperature=1.0),
            DraftRequest(ANCHOR, len(OTHER), slots[1]),
            DraftRequest(ANCHOR, len(PROMPT), slots[0]),  # greedy: the argmax
        ]
    )
    prev = torch.cat([torch.zeros(1, cfg.text.hidden_size), torch.cat(hidden)])
    want = _reference(model, weights, [*PROMPT, ANCHOR], prev)[-1]
    got = out.logprobs[0, 0]
    assert float((got - want).abs().max()) < 1e-5
    assert int(out.tokens[2, 0]) == int(want.argmax())
    assert torch.allclose(out.confidence[0, 0], want.exp().max(), atol=1e-6)


def _resolve(root: Path, speculative: str, weights: dict | None = None) -> SpecSetup:  # type: ignore[type-arg]
    cfg = load_config(root)
    held = load_weights(root, cfg, REFERENCE, None) if weights is None else weights
    config = SpeculativeConfig(mode=speculative, verify_schedule="fixed")
    return SpecSetup.resolve(config, cfg, held, platform="cpu")


def test_speculative_options(roots: dict[str, Path]) -> None:
    assert _resolve(roots["mtp"], "mtp").nextn == 1
    assert not _resolve(roots["mtp"], "auto").enabled  # cpu: auto stays off
    assert not _resolve(roots["mtp"], "off").enabled
    with pytest.raises(ValueError, match=r"^EngineConfig.speculative.mode = 'mtp' needs .* is 0"):
        _resolve(roots["plain"], "mtp")
    with pytest.raises(
        ValueError, match=r"^EngineConfig.speculative.mode = 'dspark': not available for deepseek_v4 .* 'mtp'"
    ):
        _resolve(roots["mtp"], "dspark")
    with pytest.raises(ValueError, match="no MTP layer in this project's layout"):
        _resolve(roots["mtp"], "mtp", weights={})
    v41 = parse_v41(tiny_v41())
    config = SpeculativeConfig(mode="mtp", verify_schedule="fixed")
    with pytest.raises(
        ValueError, match=r"^EngineConfig.speculative.mode = 'mtp': not available for deepseek_v41 .*'dspark'"
    ):
        SpecSetup.resolve(config, v41, {}, platform="cpu")
    with pytest.raises(
        ConfigError,
        match=r"^EngineConfig.speculative.mode = 'eagle' \(option speculative\): "
        r"expected one of 'auto', 'dspark', 'mtp', 'off'$",
    ):
        EngineConfig.from_flat(speculative="eagle")


def test_a_checkpoint_without_this_layout_loads_its_backbone(roots: dict[str, Path], tmp_path: Path) -> None:
    """`mtp.*` tensors under other names (the release's are not mapped) are skipped, not an error."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    root = tmp_path / "renamed"
    shutil.copytree(roots["mtp"], root)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(root / shard)
        save_file({k.replace("eh_proj", "eh_proj_release"): v for k, v in tensors.items()}, root / shard)
    index["weight_map"] = {k.replace("eh_proj", "eh_proj_release"): v for k, v in index["weight_map"].items()}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    weights = load_weights(root, load_config(root), REFERENCE, None)
    assert "layers.0.attn.wq_a.weight" in weights and not any(k.startswith("mtp.") for k in weights)
    with pytest.raises(ValueError, match="mtp.0.eh_proj.weight"):
        _resolve(root, "mtp", weights=weights)
