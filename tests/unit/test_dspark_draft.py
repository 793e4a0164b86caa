"""The DSpark graphs on the tiny model: the draft graph traces, verifies, prints and lowers; the target
step with the context option is the default step plus the context rings; drafts are batch invariant, read
no ring position at or after the anchor, and their distributions are the ones they were drawn from.
(Against NeMo: tests/oracle/test_dspark_vs_nemo.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsgraph.graph import format_graph
from dsgraph.graph.passes import specialize
from dsgraph.graph.serialize import deserialize, serialize
from dsgraph.graph.verify import verify
from dsgraph.models.deepseek_v41.checkpoint_spec import expected_tensors
from dsgraph.models.deepseek_v41.dspark_context import is_context_weight, is_draft_weight, ring_name
from dsgraph.models.deepseek_v41.dspark_io import DraftRequest, draft_inputs
from dsgraph.models.deepseek_v41.model import build_model
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING
from dsgraph.models.deepseek_v41.step_io import default_geometry
from dsgraph.platform.cpu.cache_format import fp8_g32_decode
from dsgraph.platform.cpu.quant import fp8_g32_qdq
from dsgraph.platform.registry import lower
from tests.oracle import model_fixtures as fx
from tests.unit.dspark_harness import DSparkRunner


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def serving(tiny: Path) -> DSparkRunner:
    return DSparkRunner(tiny, SERVING, num_slots=4)


def test_weight_roles_cover_every_draft_tensor(tiny: Path) -> None:
    names = set(expected_tensors(fx.config(tiny, None)))
    context = {n for n in names if is_context_weight(n)}
    draft = {n for n in names if is_draft_weight(n)}
    assert {n for n in names if n.startswith("mtp.")} <= context | draft
    assert "mtp.0.main_proj.weight" in context and "mtp.0.main_proj.weight" not in draft
    assert {"mtp.2.attn.wkv.weight", "mtp.2.attn.kv_norm.weight"} <= context & draft
    assert {"embed.weight", "head.weight", "mtp.2.confidence_head.proj.weight"} <= draft
    assert not any(n.startswith("layers.") for n in context | draft)


def test_draft_graph_traces_verifies_prints_and_lowers(serving: DSparkRunner) -> None:
    graph = serving.draft_graph()
    verify(graph)
    text = format_graph(graph)
    assert text.count("draft_attention[") == 3 and text.count("sampling_logprobs") == 5
    assert text.count("stream=3") == 5, "drafts draw on their own counter stream"
    assert list(graph.output_names) == ["draft_tokens", "draft_logprobs", "confidence"]
    types = {n: str(v.type) for n, v in zip(graph.output_names, graph.outputs, strict=True)}
    assert types == {
        "draft_tokens": "i32[seqs,5]",
        "draft_logprobs": "f32[seqs,5,256]",
        "confidence": "f32[seqs,5]",
    }
    assert {n for n in graph.input_names if n.startswith("caches.")} == {
        f"caches.{ring_name(s)}" for s in range(3)
    }
    concrete = specialize(graph, {"seqs": 2, "tokens": 10, "slots": 4})
    assert deserialize(serialize(concrete)) == concrete
    assert lower(concrete, "null").memory is not None


def test_context_option_keeps_the_default_step_and_fills_the_rings(tiny: Path) -> None:
    ids = fx.prompt(1, 19)
    on = DSparkRunner(tiny, REFERENCE, num_slots=2, debug=True)
    off = DSparkRunner(tiny, REFERENCE, num_slots=2, dspark=False)
    assert not any("dspark" in n for n in off.step_graph.output_names)
    extra = set(on.step_graph.output_names) - set(off.step_graph.output_names)
    assert {n for n in extra if not n.startswith("debug.")} == {f"caches.{ring_name(s)}" for s in range(3)}
    for r in (on, off):
        r.add(0)
        r.add(1)
    got_on = on.step([(1, ids[:12]), (0, ids)])
    got_off = off.step([(1, ids[:12]), (0, ids)])
    assert all(torch.equal(a, b) for a, b in zip(got_on, got_off, strict=True))
    assert all(torch.equal(on.caches[k], v) for k, v in off.caches.items())
    ring_len, slot = on.model.geo.ring_len, on.requests[0].slot
    for s in range(3):
        keys = on.last_debug[f"dspark.kv{s}"][12:]  # request 0's rows follow request 1's 12
        for p in range(len(ids) - ring_len, len(ids)):
            stored = fp8_g32_decode(on.caches[ring_name(s)][slot, p % ring_len])
            assert torch.equal(stored, fp8_g32_qdq(keys[p])), f"stage {s} position {p}"


def test_context_rings_do_not_depend_on_chunking(tiny: Path) -> None:
    ids = fx.prompt(2, 23)
    one, pieces = (DSparkRunner(tiny, SERVING, num_slots=1) for _ in range(2))
    one.add(0)
    pieces.add(0)
    one.step([(0, ids)])
    for start in range(0, len(ids), 6):
        pieces.step([(0, ids[start : start + 6])])
    for s in range(3):
        assert torch.equal(one.caches[ring_name(s)], pieces.caches[ring_name(s)])


def _prefilled(tiny: Path, prompts: dict[int, int]) -> DSparkRunner:
    r = DSparkRunner(tiny, SERVING, num_slots=4)
    for rid in prompts:
        r.add(rid)
    r.step([(rid, fx.prompt(300 + rid, n)) for rid, n in prompts.items()])
    return r


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 5}])
def test_drafts_are_batch_invariant(tiny: Path, sampling: dict) -> None:
    """The same request alone, and as the second of three (padded to a bucket of 4): identical drafts."""
    r = _prefilled(tiny, {0: 7, 1: 16, 2: 25})
    batch = [
        r.anchor(0, 11, temperature=1.0, seed=9),
        r.anchor(1, 42, **sampling),
        r.anchor(2, 77, top_k=3, temperature=0.5, seed=1),
    ]
    together = r.draft(batch, num_seqs=4)
    alone = r.draft([batch[1]])
    for name in ("draft_tokens", "draft_logprobs", "confidence"):
        assert torch.equal(together[name][1], alone[name][0]), name


def test_drafts_read_nothing_at_or_after_the_anchor(tiny: Path) -> None:
    """Keys of positions >= a (the anchor's own, rejected drafts') may hold anything: same drafts."""
    r = _prefilled(tiny, {0: 20})
    request = r.anchor(0, 30, temperature=0.8, seed=3)
    before = r.draft([request])
    gen = torch.Generator().manual_seed(0)
    ring_len = r.model.geo.ring_len
    for s in range(3):
        ring = r.caches[ring_name(s)]
        for p in range(20, 25):
            ring[request.slot, p % ring_len] = torch.randint(
                0, 256, ring.shape[2:], generator=gen, dtype=torch.uint8
            )
    after = r.draft([request])
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_drafts_follow_their_distributions(tiny: Path) -> None:
    r = DSparkRunner(tiny, SERVING, num_slots=2, debug=True)
    r.add(0)
    r.step([(0, fx.prompt(5, 12))])
    greedy = r.draft([r.anchor(0, 9)])
    logits = greedy["debug.draft_logits"][0]
    assert torch.equal(greedy["draft_tokens"][0].long(), logits.argmax(-1)), "greedy drafts are the argmax"
    want = torch.log_softmax(logits.double(), -1)
    assert torch.allclose(greedy["draft_logprobs"][0].double(), want, atol=1e-5)
    assert bool(((greedy["confidence"] > 0) & (greedy["confidence"] < 1)).all())
    runs = [r.draft([r.anchor(0, 9, temperature=1.5, seed=seed)]) for seed in (1, 1, 2, 3, 4)]
    assert torch.equal(runs[0]["draft_tokens"], runs[1]["draft_tokens"]), "a seed fixes the drafts"
    assert len({tuple(x["draft_tokens"][0].tolist()) for x in runs}) > 1, "seeds change the drafts"
    for x in runs:
        chosen = x["draft_logprobs"][0].gather(1, x["draft_tokens"][0].long().unsqueeze(1))
        assert bool((chosen > float("-inf")).all()), "a drawn token has mass under its distribution"


def test_context_option_needs_draft_stages(tiny: Path) -> None:
    cfg = fx.config(tiny, {"num_nextn_predict_layers": 0, "compress_ratios": [0, 2, 2, 1, 1, 1]})
    with pytest.raises(ValueError, match="dspark=True needs num_nextn_predict_layers > 0"):
        build_model(cfg, list(range(256)), REFERENCE, default_geometry(cfg.text), dspark=True)


def test_draft_inputs_layout(tiny: Path) -> None:
    text = fx.config(tiny, None).text
    got = draft_inputs(
        text, [DraftRequest(anchor=7, position=30, slot=2, window_start=3, seed=11)], num_seqs=2
    )
    noise = text.dspark_noise_token_id
    assert got["token_ids"].tolist() == [7] + [noise] * 4 + [noise] * 5
    assert got["positions"].tolist()[:5] == [30, 31, 32, 33, 34]
    assert got["seq_ids"].tolist() == [0] * 5 + [-1] * 5
    assert got["block_rows"].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert got["seq_start"].tolist()[0] == 30 and got["seq_window_start"].tolist()[0] == 3
    assert got["seed"].dtype == torch.int64 and got["seed"].tolist() == [11, 0]
    with pytest.raises(ValueError, match="num_seqs is 0, expected >= max"):
        draft_inputs(text, [], num_seqs=0)
