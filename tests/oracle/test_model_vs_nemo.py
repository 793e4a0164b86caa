"""The V4.1 backbone in `reference` numerics against NeMo AutoModel's independent implementation.

Both load the same released-format checkpoint (written by `make_tiny`). NeMo has no cache, so
incremental results are compared with its full-sequence logits at the same positions.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nemo_automodel")

from dsgraph.models.deepseek_v41.numerics import REFERENCE  # noqa: E402
from tests.oracle import model_fixtures as fx  # noqa: E402
from tests.oracle.nemo_ref import load_nemo_model, nemo_logits, select_all_overrides  # noqa: E402

TOL = 1e-4  # max |diff| <= TOL * max |logit|
SELECT_ALL = select_all_overrides(256)


@pytest.fixture(scope="module", params=sorted(fx.CONFIGS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint(request.param, str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def nemo_all(model_dir):  # type: ignore[no-untyped-def]
    return load_nemo_model(model_dir, SELECT_ALL)


@pytest.mark.parametrize("length", [1, 7, 24, 64, 200])
def test_prefill_logits_select_everything(model_dir, nemo_all, length: int) -> None:  # type: ignore[no-untyped-def]
    ids = fx.prompt(length, length)
    r = fx.runner(model_dir, REFERENCE, SELECT_ALL)
    r.add(0)
    got = r.step([(0, ids)])[0]
    want = nemo_logits(nemo_all, ids)
    assert fx.rel_err(got, want) <= TOL


def test_decode_40_steps_three_requests_batched(model_dir, nemo_all) -> None:  # type: ignore[no-untyped-def]
    lengths = {0: 5, 1: 17, 2: 30}
    full = {rid: fx.prompt(100 + rid, n + 40) for rid, n in lengths.items()}
    want = {rid: nemo_logits(nemo_all, ids) for rid, ids in full.items()}
    r = fx.runner(model_dir, REFERENCE, SELECT_ALL)
    for rid in lengths:
        r.add(rid)
    prefill = r.step([(rid, full[rid][:n]) for rid, n in lengths.items()])
    for rid, n in lengths.items():
        assert fx.rel_err(prefill[rid], want[rid][:n]) <= TOL, f"prefill of request {rid}"
    for step in range(40):
        out = r.step([(rid, [full[rid][n + step]]) for rid, n in lengths.items()])
        for rid, n in lengths.items():
            assert fx.rel_err(out[rid][0], want[rid][n + step]) <= TOL, f"request {rid} decode step {step}"


@pytest.mark.parametrize("chunk", [1, 5, 17])
def test_chunked_prefill_equals_one_shot(model_dir, chunk: int) -> None:  # type: ignore[no-untyped-def]
    ids = fx.prompt(chunk, 40)
    one = fx.runner(model_dir, REFERENCE)
    one.add(0)
    whole = one.step([(0, ids)])[0]
    pieces = fx.runner(model_dir, REFERENCE)
    pieces.add(0)
    got = torch.cat([pieces.step([(0, ids[i : i + chunk])])[0] for i in range(0, len(ids), chunk)])
    assert fx.rel_err(got, whole) <= 1e-5
    for name, cache in one.caches.items():
        if name.startswith(("ckv", "kidx", "swa")):  # byte caches: equal up to rare one-code flips
            assert (cache != pieces.caches[name]).float().mean() < 1e-3, name
