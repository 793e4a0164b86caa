"""DeepSeek-V4 in `reference` numerics against transformers' DeepseekV4ForCausalLM (CPU, FP32, eager).

Both read the same released-format checkpoint written by `models/deepseek_v4/tiny.make_tiny`. transformers
runs the whole sequence at once; our prefill, chunked prefill and every decode step are compared with its
logits at the same positions (the model is causal). With an indexer top-k that selects every entry the
logits match to FP32 rounding; with the tiny top-k of 3 ReLU zeros make equal indexer scores at the
selection boundary, where two correct implementations may choose differently, so rows are compared up to
the first row whose selection has such a tie (everything after it may legitimately differ).
"""

from __future__ import annotations

import json
from functools import cache

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4")

from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors, is_skipped  # noqa: E402
from dsgraph.models.deepseek_v4.config import load_config  # noqa: E402
from dsgraph.models.deepseek_v4.layers import Attn  # noqa: E402
from dsgraph.models.deepseek_v4.model import build_model  # noqa: E402
from dsgraph.models.deepseek_v4.tiny import make_tiny  # noqa: E402
from dsgraph.models.deepseek_v4.weights import prepare_weights  # noqa: E402
from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint  # noqa: E402
from dsgraph.models.deepseek_v41.numerics import REFERENCE  # noqa: E402
from dsgraph.models.deepseek_v41.step_io import default_geometry  # noqa: E402
from dsgraph.runtime.step_runner import StepRunner  # noqa: E402
from dsgraph.tools.bench.v4_transformers import load_tf_model, tf_logits  # noqa: E402

TOL = 5e-6  # max |diff| <= TOL * max |logit|: FP32 rounding of two summation orders (seen: 1e-6)
CONFIGS = {"select_all": {"index_topk": 64}, "topk3": {}}


@cache
def _checkpoint(name: str, root: str) -> str:
    return str(make_tiny(f"{root}/v4-{name}", seed=1, overrides=CONFIGS[name]))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    model_dir = _checkpoint(request.param, str(tmp_path_factory.getbasetemp()))
    cfg = load_config(model_dir)
    cfg_dict = json.loads(open(f"{model_dir}/config.json").read())
    stored = load_checkpoint(model_dir, cfg, expected=expected_tensors(cfg), skipped=is_skipped)
    weights = prepare_weights(cfg, stored, REFERENCE)
    model = build_model(cfg, REFERENCE, default_geometry(cfg.text, 256, page_size=8))
    return request.param, model, weights, load_tf_model(model_dir, cfg_dict, cfg)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def first_tie(model, debug_steps: list[dict[str, torch.Tensor]], k: int) -> int:  # type: ignore[no-untyped-def]
    """The first row (over the concatenated steps) where a CSA selection's k-th and (k+1)-th best visible
    scores are equal, or the number of rows when there is none."""
    rows, offset = None, 0
    for debug in debug_steps:
        n = next(iter(debug.values())).shape[0]
        for p in model.plans:
            if p.attn is not Attn.CSA:
                continue
            s = debug[f"index_scores.{p.index}"].sort(dim=1, descending=True).values
            if s.shape[1] <= k:
                continue
            tied = (s[:, k - 1] == s[:, k]) & (s[:, k] > float("-inf"))
            if bool(tied.any()):
                row = offset + int(tied.nonzero()[0, 0])
                rows = row if rows is None else min(rows, row)
        offset += n
    return offset if rows is None else rows


def compare(setup, chunks: list[int], seed: int) -> None:  # type: ignore[no-untyped-def]
    name, model, weights, tf = setup
    ids = prompt(sum(chunks), seed)
    runner = StepRunner(model, weights, num_slots=2, num_pages=32, debug=True)
    runner.add(0)
    got, debug, start = [], [], 0
    for n in chunks:
        got.append(runner.step([(0, ids[start : start + n])])[0])
        debug.append(runner.last_debug)
        start += n
    ours, want = torch.cat(got), tf_logits(tf, ids)
    rows = len(ids) if name == "select_all" else first_tie(model, debug, model.cfg.text.index_topk)
    assert rows >= min(len(ids), 12), f"a tie at row {rows} leaves too little to compare"
    assert rel_err(ours[:rows], want[:rows]) <= TOL


@pytest.mark.parametrize("length", [1, 7, 24, 64])
def test_prefill(setup, length: int) -> None:  # type: ignore[no-untyped-def]
    compare(setup, [length], seed=length)


def test_chunked_prefill(setup) -> None:  # type: ignore[no-untyped-def]
    compare(setup, [5, 11, 3, 21], seed=2)


def test_every_decode_step(setup) -> None:  # type: ignore[no-untyped-def]
    compare(setup, [9] + [1] * 30, seed=3)
