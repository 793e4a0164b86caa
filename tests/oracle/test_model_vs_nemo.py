"""The V4.1 backbone in `reference` numerics against NeMo AutoModel's independent implementation.

Both load the same released-format checkpoint (written by `make_tiny`). NeMo has no cache, so
incremental results are compared with its full-sequence logits at the same positions. Logits are
compared on every row, with NeMo fed our rounded values at the cache-quantization boundaries after
checking that its own inputs there agree with ours (see boundary_check.py: a value within 1e-7 of a
rounding boundary may otherwise round differently in two correct implementations).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nemo_automodel")

from dsgraph.models.deepseek_v41.layers_plan import LayerMode  # noqa: E402
from dsgraph.models.deepseek_v41.numerics import REFERENCE  # noqa: E402
from tests.oracle import model_fixtures as fx  # noqa: E402
from tests.oracle.boundary_check import INPUT_TOL, ours_in_nemo_layout, substituted_boundaries  # noqa: E402
from tests.oracle.nemo_ref import load_nemo_model, nemo_logits, select_all_overrides  # noqa: E402

TOL = 1e-4  # max |diff| <= TOL * max |logit|
SELECT_ALL = select_all_overrides(256)


@pytest.fixture(scope="module", params=sorted(fx.CONFIGS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint(request.param, str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def nemo_all(model_dir):  # type: ignore[no-untyped-def]
    return load_nemo_model(model_dir, SELECT_ALL)


def _ratios(r) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return {p.index: p.ratio for p in r.model.plans if p.mode is LayerMode.FULL}


def nemo_like_ours(
    model, ids: list[int], debug: dict[str, torch.Tensor], ratios: dict[int, int]
) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """NeMo's logits with our rounded values at every cache boundary (after checking its inputs)."""
    with substituted_boundaries(model, ours_in_nemo_layout(debug, ratios)) as b:
        logits = nemo_logits(model, ids)
    assert b.errors, "no boundary was checked"
    assert b.max_error() <= INPUT_TOL, f"NeMo's boundary inputs differ from ours by {b.max_error():.2e}"
    return logits


@pytest.mark.parametrize("length", [1, 7, 24, 64, 200])
def test_prefill_logits_select_everything(model_dir, nemo_all, length: int) -> None:  # type: ignore[no-untyped-def]
    ids = fx.prompt(length, length)
    r = fx.runner(model_dir, REFERENCE, SELECT_ALL, debug=True)
    r.add(0)
    got = r.step([(0, ids)])[0]
    want = nemo_like_ours(nemo_all, ids, r.last_debug, _ratios(r))
    assert fx.rel_err(got, want) <= TOL


def _split_debug(debug: dict[str, torch.Tensor], lengths: list[int]) -> list[dict[str, torch.Tensor]]:
    parts = {k: torch.split(v, lengths) for k, v in debug.items()}
    return [{k: v[i] for k, v in parts.items()} for i in range(len(lengths))]


def test_decode_40_steps_three_requests_batched(model_dir, nemo_all) -> None:  # type: ignore[no-untyped-def]
    lengths = {0: 5, 1: 17, 2: 30}
    full = {rid: fx.prompt(100 + rid, n + 40) for rid, n in lengths.items()}
    r = fx.runner(model_dir, REFERENCE, SELECT_ALL, debug=True)
    for rid in lengths:
        r.add(rid)
    logits: dict[int, list[torch.Tensor]] = {rid: [] for rid in lengths}
    debug: dict[int, list[dict[str, torch.Tensor]]] = {rid: [] for rid in lengths}
    chunks = [(rid, full[rid][:n]) for rid, n in lengths.items()]
    for step in range(41):
        out = r.step(chunks)
        for (rid, _new), got, dbg in zip(
            chunks, out, _split_debug(r.last_debug, [len(c) for _, c in chunks]), strict=True
        ):
            logits[rid].append(got)
            debug[rid].append(dbg)
        chunks = [(rid, [full[rid][n + step]]) for rid, n in lengths.items()] if step < 40 else []
    for rid, n in lengths.items():
        ours = {k: torch.cat([d[k] for d in debug[rid]]) for k in debug[rid][0]}
        want = nemo_like_ours(nemo_all, full[rid], ours, _ratios(r))
        got = torch.cat(logits[rid])
        assert got.shape[0] == len(full[rid])
        assert fx.rel_err(got[:n], want[:n]) <= TOL, f"request {rid} prefill"
        for step in range(40):
            assert fx.rel_err(got[n + step], want[n + step]) <= TOL, f"request {rid} decode step {step}"


@pytest.mark.parametrize("chunk", [1, 5, 17])
def test_chunked_prefill_equals_one_shot(model_dir, chunk: int) -> None:  # type: ignore[no-untyped-def]
    ids = fx.prompt(chunk, 40)
    one = fx.runner(model_dir, REFERENCE)
    one.add(0)
    whole = one.step([(0, ids)])[0]
    pieces = fx.runner(model_dir, REFERENCE)
    pieces.add(0)
    got = torch.cat([pieces.step([(0, ids[i : i + chunk])])[0] for i in range(0, len(ids), chunk)])
    # the cpu reference is batch invariant: chunking changes no bit of the logits or of any cache
    assert torch.equal(got, whole)
    for name, cache in one.caches.items():
        assert torch.equal(cache, pieces.caches[name]), name
