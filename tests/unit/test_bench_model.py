"""The benchmark's model pieces, checked on CPU: the truncated full-width config keeps every layer
mode, and device-generated random weights have exactly the layout the loader gives a real checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsgraph.models.deepseek_v41.checkpoint_io import load_checkpoint
from dsgraph.models.deepseek_v41.dummy_weights import random_serving_weights
from dsgraph.models.deepseek_v41.engram_map import build_token_map, load_tokenizer
from dsgraph.models.deepseek_v41.layers_plan import LayerMode, layer_plans
from dsgraph.models.deepseek_v41.numerics import SERVING
from dsgraph.models.deepseek_v41.weights import prepare_weights
from dsgraph.tools.bench.model_config import LAYER_COUNTS, bench_config
from tests.oracle import model_fixtures as fx


def _kind(mode: LayerMode, ratio: int) -> str:
    return "swa" if mode is LayerMode.SWA else f"{mode.name.lower()}_r{ratio}"


def test_bench_config_keeps_every_layer_mode_at_full_width() -> None:
    cfg = bench_config()
    kinds = [_kind(p.mode, p.ratio) for p in layer_plans(cfg.text)]
    assert {k: kinds.count(k) for k in set(kinds)} == {k: n for k, (n, _) in LAYER_COUNTS.items()}
    assert sum(n40 for _, n40 in LAYER_COUNTS.values()) == 40
    t = cfg.text
    assert (t.hidden_size, t.num_attention_heads, t.head_dim) == (5120, 64, 512)
    assert (t.n_routed_experts, t.moe_intermediate_size, t.vocab_size) == (384, 2304, 129280)
    wider = [_kind(p.mode, p.ratio) for p in layer_plans(bench_config(extra_reuse=2).text)]
    assert wider.count("reuse_r2") == 3 and wider.count("reuse_r1") == 4


def test_random_weights_match_the_loaded_layout(tmp_path: Path) -> None:
    model_dir = fx.checkpoint("tiny", str(tmp_path))
    cfg = fx.config(model_dir, None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    loaded = prepare_weights(cfg, load_checkpoint(model_dir, cfg, progress=False), SERVING, token_map)
    want = {k: (tuple(v.shape), v.dtype) for k, v in loaded.items() if not k.startswith("mtp.")}
    # the tiny checkpoint's head has F32 values; the bench's are the release's BF16 ones, held in BF16
    assert want["head.weight"][1] == torch.float32
    want["head.weight"] = (want["head.weight"][0], torch.bfloat16)
    got = random_serving_weights(cfg, token_map, seed=3, device="cpu")
    assert {k: (tuple(v.shape), v.dtype) for k, v in got.items()} == want
    assert torch.equal(got["engram.token_map"], loaded["engram.token_map"])


def test_a_large_fp8_rows_table_is_sampled_a_block_of_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench model's Engram table (23 GiB as FP32) is generated in blocks of rows: one block gives the
    unblocked result exactly; several give each block the FP8-rows codec's encoding of the next draws of
    the generator (blocks of 300 rows: 300, 300, 300, 100; on the CPU the same values as one draw, on a
    GPU other ones), with the sampled distribution."""
    from dsgraph.models.deepseek_v41 import dummy_weights
    from dsgraph.models.deepseek_v41.tiny import sample_weight
    from dsgraph.platform.cpu.quant import fp8_rows_dequantize, fp8_rows_quantize

    name, shape = "layers.1.engram.embed.weight", (1000, 64)

    def run(elements: int) -> tuple[torch.Tensor, torch.Tensor]:
        monkeypatch.setattr(dummy_weights, "SAMPLE_ELEMENTS", elements)
        return dummy_weights._stored_rows(name, shape, torch.Generator().manual_seed(4))

    def draws(blocks: list[int]) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(4)
        parts = [fp8_rows_quantize(sample_weight(name, (rows, 64), gen)) for rows in blocks]
        return [torch.cat([part[i] for part in parts]).view(torch.uint8) for i in (0, 1)]

    for blocks, elements in (([1000], 1 << 20), ([300, 300, 300, 100], 64 * 300)):
        got = run(elements)
        for have, want in zip(got, draws(blocks), strict=True):
            assert torch.equal(have.view(torch.uint8), want)
    std = fp8_rows_dequantize(*got).std().item()
    assert 0.95 < std < 1.05  # embeddings are N(0, 1)


def test_bench_steps_run_on_the_tiny_model(tmp_path: Path) -> None:
    """The bench's prefill and decode step inputs are valid steps (run on the cpu platform, tiny model)."""
    from dsgraph.runtime.session import CacheSizes, Session
    from dsgraph.tools.bench.model_bench import fill_caches
    from dsgraph.tools.bench.steps import decode_step, pages_for, prefill_step

    model_dir = fx.checkpoint("tiny", str(tmp_path))
    cfg = fx.config(model_dir, None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    from dsgraph.models.deepseek_v41.model import build_model
    from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios

    model = build_model(cfg, token_map, SERVING, default_geometry(cfg.text, 96, 16))
    weights = random_serving_weights(cfg, token_map, device="cpu")
    pages = {r: 3 * pages_for(model, r, 90) for r in ratios(model.plans)}
    session = Session(model, weights, CacheSizes(3, pages))
    assert session.run(prefill_step(model, 40)).shape == (1, cfg.text.vocab_size)
    fill_caches(session)
    logits = session.run(decode_step(model, 3, 90))
    assert logits.shape == (3, cfg.text.vocab_size) and bool(torch.isfinite(logits).all())


def test_meta_weights_match_the_random_ones(tmp_path: Path) -> None:
    from dsgraph.models.deepseek_v41.dummy_weights import meta_serving_weights

    model_dir = fx.checkpoint("tiny", str(tmp_path))
    cfg = fx.config(model_dir, None)
    token_map, _ = build_token_map(load_tokenizer(model_dir))
    for dspark in (False, True):
        got = random_serving_weights(cfg, token_map, device="cpu", dspark=dspark)
        meta = meta_serving_weights(cfg, dspark=dspark)
        assert {k: (tuple(v.shape), v.dtype) for k, v in meta.items()} == {
            k: (tuple(v.shape), v.dtype) for k, v in got.items()
        }


def test_the_wider_bench_model_shares_weights_layer_by_kind() -> None:
    from dsgraph.tools.bench.model_bench import layer_map

    # by hand from the two configs' layer tables: the 4 added Reuse layers take a Reuse layer's weights
    want = {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6, 9: 7, 10: 7, 11: 7}
    assert layer_map(bench_config(), bench_config(extra_reuse=2)) == want
