"""The DSpark drafter in `reference` numerics against NeMo AutoModel's DSpark backbone (explicit anchors).

Our side: target steps with the DSpark context on (tests/unit/dspark_harness.py) run over a prompt whose
last token is the anchor t_a at position a, then one draft pass. NeMo's side: its target forward gives
the features (`nemo_target_features`), its `DeepseekV41DSparkBackbone` drafts the block [t_a, NOISE x 4]
with the context window a-W .. a-1, teacher-forced with our drafts as the Markov head's previous tokens.

Compared: target features; every stage's context keys and block keys before their FP8 rounding (NeMo is
fed our rounded values there after the check, as in boundary_check.py, so a value within 1e-7 of an FP8
boundary cannot make the runs drift); base logits U_k and Markov-corrected logits; confidences with the
post-norm input (NeMo's) and with the pre-norm input (the released weights': NeMo's pre-norm state and
Markov embedding through the same confidence weight); and the greedy drafts themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

pytest.importorskip("nemo_automodel")

from nemo_automodel.components.models.deepseek_v41 import dspark as nemo_dspark_module  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.dspark import DeepseekV41DSparkBackbone  # noqa: E402
from nemo_automodel.components.speculative.dspark.common import create_noise_embed  # noqa: E402

from dsgraph.models.deepseek_v41.dspark_io import DraftRequest  # noqa: E402
from dsgraph.models.deepseek_v41.layers_plan import LayerMode  # noqa: E402
from dsgraph.models.deepseek_v41.numerics import REFERENCE  # noqa: E402
from dsgraph.platform.cpu.quant import fp8_g32_qdq  # noqa: E402
from tests.oracle import model_fixtures as fx  # noqa: E402
from tests.oracle.boundary_check import INPUT_TOL, ours_in_nemo_layout, substituted_boundaries  # noqa: E402
from tests.oracle.nemo_ref import load_nemo_dspark, load_nemo_model, nemo_target_features  # noqa: E402
from tests.unit.dspark_harness import DSparkRunner  # noqa: E402

TOL = 1e-4  # max |diff| <= TOL * max |logit|, as test_model_vs_nemo.py
CONF_TOL = 1e-5  # absolute, on probabilities in [0, 1]


@pytest.fixture(scope="module", params=sorted(fx.CONFIGS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint(request.param, str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def nemo(model_dir):  # type: ignore[no-untyped-def]
    return load_nemo_model(model_dir, fx.SELECT_ALL_TINY), load_nemo_dspark(model_dir, fx.SELECT_ALL_TINY)


@pytest.fixture(scope="module")
def runner(model_dir) -> DSparkRunner:  # type: ignore[no-untyped-def]
    return DSparkRunner(model_dir, REFERENCE, fx.SELECT_ALL_TINY, num_slots=4, num_pages=48, debug=True)


def _features(target, ids: list[int], debug: dict[str, torch.Tensor], r: DSparkRunner) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """NeMo's target features with our rounded values at the backbone's cache boundaries (checked)."""
    ratios = {p.index: p.ratio for p in r.model.plans if p.mode is LayerMode.FULL}
    with substituted_boundaries(target, ours_in_nemo_layout(debug, ratios)) as b:
        features = nemo_target_features(target, ids)
    assert b.max_error() <= INPUT_TOL, (
        f"NeMo's backbone boundary inputs differ from ours by {b.max_error():.2e}"
    )
    return features


@contextmanager
def _draft_boundaries(
    draft, ours: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> Iterator[dict[str, float]]:  # type: ignore[no-untyped-def]
    """Inside the block NeMo's DSpark FP8 rounding checks its input against ours and returns our rounding.

    `ours[stage]` = (context keys [n, hd], block keys [K, hd]) before rounding; a stage rounds its context
    keys first, then its block keys."""
    current = {"stage": -1, "call": 0}
    errors: dict[str, float] = {}
    original = nemo_dspark_module.quantize_cache

    def spy(x: torch.Tensor, *, format: str, block_size: int) -> torch.Tensor:  # noqa: A002
        assert (format, block_size) == ("fp8", 32), (format, block_size)
        stage, call = current["stage"], current["call"]
        current["call"] += 1
        mine, theirs = ours[stage][call], x[0].detach()
        assert mine.shape == theirs.shape, (
            f"stage {stage} call {call}: {tuple(mine.shape)} vs {tuple(theirs.shape)}"
        )
        name = f"stage {stage} " + ("context keys" if call == 0 else "block keys")
        errors[name] = float((mine - theirs).abs().max() / theirs.abs().max())
        return fp8_g32_qdq(mine).unsqueeze(0).to(x.dtype)

    def enter(stage: int):  # type: ignore[no-untyped-def]
        return lambda _m, _a: current.update(stage=stage, call=0)

    hooks = [block.register_forward_pre_hook(enter(s)) for s, block in enumerate(draft.mtp)]
    nemo_dspark_module.quantize_cache = spy
    try:
        yield errors
    finally:
        nemo_dspark_module.quantize_cache = original
        for h in hooks:
            h.remove()


def _nemo_round(
    draft, ids: list[int], features: torch.Tensor, previous: list[int]
) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """NeMo's drafting round anchored at the last of `ids`, teacher-forced with `previous` Markov tokens."""
    captured: dict[str, torch.Tensor] = {}
    last = draft.mtp[-1]
    hooks = [
        last.norm.register_forward_pre_hook(lambda _m, a: captured.__setitem__("pre_norm", a[0])),
        last.markov_head.embed.register_forward_hook(lambda _m, _a, o: captured.__setitem__("markov", o)),
    ]
    anchor = torch.tensor([[len(ids) - 1]])
    keep = torch.ones_like(anchor, dtype=torch.bool)
    text = draft.config
    try:
        with torch.no_grad():
            noise = create_noise_embed(
                draft.embed_tokens,
                torch.tensor([ids]),
                anchor,
                keep,
                mask_token_id=text.dspark_noise_token_id,
                block_size=text.dspark_block_size,
            )
            out = DeepseekV41DSparkBackbone.forward(
                draft,
                noise,
                features[None].to(noise.dtype),
                position_ids=draft.build_position_ids(anchor, len(ids)),
                attention_mask=draft.build_attention_mask(anchor, keep, len(ids), noise.dtype),
                previous_token_ids=torch.tensor([previous]),
                enable_confidence_head=True,
            )
            base = draft.compute_logits(out.normalized_hidden_states)[0]
    finally:
        for h in hooks:
            h.remove()
    weight = last.confidence_head.proj.weight.float()
    pre = torch.cat((captured["pre_norm"][0].float(), captured["markov"][0].float()), dim=-1) @ weight.T
    return {
        "base": base,
        "logits": base + out.transition_logits[0].float(),
        "post_norm_confidence": torch.sigmoid(out.confidence_pred[0].float()),
        "pre_norm_confidence": torch.sigmoid(pre.squeeze(-1)),
    }


def _compare(nemo, r: DSparkRunner, ids: list[int], debug: dict[str, torch.Tensor], rid: int) -> None:  # type: ignore[no-untyped-def]
    """Request `rid`'s draft (its target debug rows in `debug`) against NeMo's round on `ids`."""
    target, draft = nemo
    plans = range(r.text.num_hidden_layers, r.text.num_hidden_layers + r.text.num_nextn_predict_layers)
    features = _features(target, ids, debug, r)
    assert fx.rel_err(debug["dspark.features"], features) <= TOL, "target features"
    request = DraftRequest(anchor=ids[-1], position=len(ids) - 1, slot=r.requests[rid].slot)
    ours = {ci: r.draft([request], confidence_input=ci) for ci in ("pre_norm", "post_norm")}
    out, k = ours["pre_norm"], r.text.dspark_block_size
    keys = {st: (debug[f"dspark.kv{st}"], out[f"debug.kv_pre.{i}"]) for st, i in enumerate(plans)}
    previous = [ids[-1], *out["draft_tokens"][0, : k - 1].tolist()]
    with _draft_boundaries(draft, keys) as errors:
        want = _nemo_round(draft, ids, features, previous)
    assert errors and max(errors.values()) <= INPUT_TOL, errors
    assert fx.rel_err(out["debug.base_logits"][0], want["base"]) <= TOL, "U_k"
    assert fx.rel_err(out["debug.draft_logits"][0], want["logits"]) <= TOL, "Markov-corrected logits"
    for ci in ("pre_norm", "post_norm"):
        got = ours[ci]["confidence"][0]
        assert (got - want[f"{ci}_confidence"]).abs().max() <= CONF_TOL, f"{ci} confidence"
    top2 = want["logits"].topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > TOL * want["logits"].abs().max()
    drafts = out["draft_tokens"][0].long()
    assert torch.equal(drafts[clear], want["logits"].argmax(-1)[clear]), "greedy drafts"


@pytest.mark.parametrize("length", [2, 9, 30])
def test_draft_after_prefill(nemo, runner: DSparkRunner, length: int) -> None:  # type: ignore[no-untyped-def]
    ids = fx.prompt(40 + length, length)
    rid = 100 + length
    runner.add(rid)
    runner.step([(rid, ids)])  # the anchor's own context key is written too; the draft never reads it
    debug = dict(runner.last_debug)
    try:
        _compare(nemo, runner, ids, debug, rid)
    finally:
        runner.release(rid)


def _split(debug: dict[str, torch.Tensor], lengths: list[int]) -> list[dict[str, torch.Tensor]]:
    parts = {k: torch.split(v, lengths) for k, v in debug.items() if v.shape[:1] == (sum(lengths),)}
    return [{k: v[i] for k, v in parts.items()} for i in range(len(lengths))]


def test_draft_after_batched_decode_steps(nemo, model_dir) -> None:  # type: ignore[no-untyped-def]
    """Three requests: prefill, five batched decode steps (the rings wrap), then each one's draft."""
    r = DSparkRunner(model_dir, REFERENCE, fx.SELECT_ALL_TINY, num_slots=3, num_pages=48, debug=True)
    prompts = {0: 4, 1: 13, 2: 21}
    full = {rid: fx.prompt(200 + rid, n + 5) for rid, n in prompts.items()}
    debug: dict[int, list[dict[str, torch.Tensor]]] = {rid: [] for rid in prompts}
    for rid in prompts:
        r.add(rid)
    chunks = [(rid, full[rid][:n]) for rid, n in prompts.items()]
    for step in range(6):
        r.step(chunks)
        for (rid, _), part in zip(chunks, _split(r.last_debug, [len(c) for _, c in chunks]), strict=True):
            debug[rid].append(part)
        chunks = [(rid, full[rid][n + step : n + step + 1]) for rid, n in prompts.items()]
    for rid in prompts:
        merged = {k: torch.cat([d[k] for d in debug[rid]]) for k in debug[rid][0]}
        _compare(nemo, r, full[rid], merged, rid)
