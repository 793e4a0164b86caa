"""Small top-k and candidate limits (the checkpoint's own): selections tie-aware equal to NeMo's,
and logits equal up to the first row where a tie was broken differently (after that row the two
runs legitimately attend to different keys)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nemo_automodel")

from nemo_automodel.components.models.deepseek_v41.attention import _Indexer  # noqa: E402

from dsgraph.models.deepseek_v41.layers_plan import LayerMode  # noqa: E402
from dsgraph.models.deepseek_v41.numerics import REFERENCE  # noqa: E402
from tests.oracle import model_fixtures as fx  # noqa: E402
from tests.oracle.boundary_check import INPUT_TOL, Boundaries, ours_in_nemo_layout, substituted_boundaries  # noqa: E402
from tests.oracle.nemo_ref import load_nemo_model, nemo_logits  # noqa: E402
from tests.oracle.selection_check import candidates_tie_equivalent, tie_equivalent  # noqa: E402

TOL = 1e-4


def _nemo_selections(model, ids: list[int], b: Boundaries) -> tuple[torch.Tensor, dict]:  # type: ignore[no-untyped-def,type-arg]
    """NeMo's logits and per-layer indexer states, with our rounded values at the cache boundaries."""
    found: dict = {}  # type: ignore[type-arg]
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, _Indexer):
            layer = int(name.split(".")[2])
            hooks.append(module.register_forward_hook(lambda m, a, out, k=layer: found.__setitem__(k, out)))
    try:
        with substituted_boundaries(model, b):
            logits = nemo_logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return logits, found


def _divergence_at_row(ours: dict[str, torch.Tensor], ref: dict, t: int, block_size: int) -> bool:  # type: ignore[type-arg]
    """Whether NeMo and we chose differently at row t in some layer (asserting the difference is a tie)."""
    for layer in sorted(ref):
        state, scores = ref[layer], ours[f"index_scores.{layer}"][t]
        if f"candidates.{layer}" in ours:
            theirs_c = state.candidates[0, t]  # NeMo's entry axis is the sequence's, ours the page table's
            mine_c, width = ours[f"candidates.{layer}"][t], theirs_c.numel()
            assert not mine_c[width:].any(), f"row {t} layer {layer}: candidates beyond the sequence"
            mine_c = mine_c[:width]
            if not torch.equal(mine_c, theirs_c):
                assert candidates_tie_equivalent(mine_c, theirs_c, scores, block_size), (
                    f"row {t} layer {layer} candidates"
                )
                return True
        mine, theirs = ours[f"topk.{layer}"][t], state.topk_indices[0, t]
        if {int(i) for i in mine if i >= 0} != {int(i) for i in theirs if i >= 0}:
            assert tie_equivalent(mine, theirs, scores), (
                f"row {t} layer {layer}: {mine.tolist()} vs {theirs.tolist()}"
            )
            return True
    return False


def _first_divergence(
    ours: dict[str, torch.Tensor], ref: dict, rows: int, block_size: int
) -> tuple[int, int]:  # type: ignore[type-arg]
    """(first row whose choices differ from NeMo's by a tie, restricting row-layers compared before it)."""
    checked = 0
    for t in range(rows):
        if _divergence_at_row(ours, ref, t, block_size):
            return t, checked
        checked += sum(
            int(torch.isfinite(ours[f"index_scores.{k}"][t]).sum() > ours[f"topk.{k}"].shape[1]) for k in ref
        )
    return rows, checked


@pytest.mark.parametrize("name", sorted(fx.CONFIGS))
def test_small_topk_selections_and_logits(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    model_dir = fx.checkpoint(name, str(tmp_path_factory.getbasetemp()))
    nemo = load_nemo_model(model_dir)
    restricted, compared = 0, 0
    for seed in range(4):
        ids = fx.prompt(300 + seed, 64)
        r = fx.runner(model_dir, REFERENCE, debug=True)
        r.add(0)
        got = r.step([(0, ids)])[0]
        ratios = {p.index: p.ratio for p in r.model.plans if p.mode is LayerMode.FULL}
        b = ours_in_nemo_layout(r.last_debug, ratios)
        want, selections = _nemo_selections(nemo, ids, b)
        first, checked = _first_divergence(
            r.last_debug, selections, len(ids), r.model.cfg.text.candidate_block_size
        )
        assert b.max_error(before_row=first) <= INPUT_TOL, (
            f"prompt {seed}: boundary inputs before row {first}"
        )
        restricted += checked
        compared += first
        if first:
            assert fx.rel_err(got[:first], want[:first]) <= TOL, f"prompt {seed}: rows before {first}"
    # the comparison must have covered real selections (more visible entries than top-k) on many rows
    print(f"{name}: {compared} rows compared, {restricted} restricting row-layers")
    assert restricted >= 40, f"only {restricted} restricting row-layers were compared"
    assert compared >= 30
