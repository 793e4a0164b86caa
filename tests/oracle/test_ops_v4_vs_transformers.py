"""V4's own ops against transformers' DeepseekV4 modules (CPU, FP32), with random weights.

- `window_compress` (+ the compressor's norm and RoPE) against `DeepseekV4CSACompressor` (ratio 4,
  overlapping windows) and `DeepseekV4HCACompressor` (non-overlapping), for a whole sequence and for the
  same sequence in chunks (our state ring carries the open window and, for CSA, the previous window);
- the final stream collapse (`hc_head` as ops) against `DeepseekV4HyperHead`;
- hash routing (`moe_route` with the hash bias) against `DeepseekV4HashRouter`.
Outputs must equal transformers' to FP32 rounding.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4")

from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M  # noqa: E402

from dsgraph.graph import TensorType, make_graph  # noqa: E402
from dsgraph.models.deepseek_v4.config import parse_config  # noqa: E402
from dsgraph.models.deepseek_v4.tiny import tiny_config_dict  # noqa: E402
from dsgraph.models.deepseek_v4.weights import _hash_bias  # noqa: E402
from dsgraph.models.deepseek_v41.step_io import ROLLBACK_ROOM  # noqa: E402
from dsgraph.ops import op  # noqa: E402
from dsgraph.ops.window_compress import window_span  # noqa: E402
from dsgraph.platform.cpu.interpret import run_graph  # noqa: E402
from dsgraph.tools.bench.v4_transformers import hf_config  # noqa: E402

TOL = 2e-6
CFG_DICT = tiny_config_dict()
CFG = parse_config(CFG_DICT)
HF = hf_config(CFG_DICT, CFG)
T, S = "tokens", "seqs"


def tt(shape: tuple, dtype: str = "i32") -> TensorType:
    return TensorType(shape, dtype)


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if p.dim() < 2 else p.shape[-1] ** -0.5))


def _ours(module, ratio: int, overlap: bool, h: torch.Tensor, chunks: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Compressed entries (normed, rotated at the window's first position) from our ops, step by step."""
    width, hidden = module.kv_proj.weight.shape
    t, ring = CFG.text, window_span(ratio, overlap) + ROLLBACK_ROOM - 1

    def step(u, wkv, wgate, ape, state, norm, positions, seq_ids, slot, start):  # type: ignore[no-untyped-def]
        latent, closes, new_state = op.window_compress(
            u, wkv, wgate, ape, state, positions, seq_ids, slot, start, ratio=ratio, overlap=overlap
        )
        normed = op.rms_norm(latent, norm, eps=float(t.rms_norm_eps))
        scaling = t.rope_scaling
        yarn = dict(
            yarn_factor=float(scaling.factor),
            beta_fast=float(scaling.beta_fast),
            beta_slow=float(scaling.beta_slow),
            original_max=int(scaling.original_max_position_embeddings),
        )
        first = (positions // ratio) * ratio
        theta = float(t.compress_rope_theta)
        entry = op.rope(normed, first, rope_dim=t.qk_rope_head_dim, theta=theta, **yarn)
        return {"entry": entry, "closes": closes, "state": new_state}

    out_width = width // 2 if overlap else width
    types = [tt((T, hidden), "f32"), tt((width, hidden), "f32"), tt((width, hidden), "f32")]
    types += [tt((ratio, width), "f32"), tt((1, ring, 2, width), "f32"), tt((out_width,), "f32")]
    graph = make_graph(step, *types, tt((T,)), tt((T,)), tt((S,)), tt((S,)))
    weights = [module.kv_proj.weight, module.gate_proj.weight, module.position_bias]
    state, entries, start = torch.zeros(1, ring, 2, width), [], 0
    for n in chunks:
        args = [h[start : start + n], *weights, state, module.kv_norm.weight]
        args += [i32(list(range(start, start + n))), i32([0] * n), i32([0]), i32([start])]
        out = run_graph(graph, [a.detach() for a in args])
        state = out["state"]
        entries.append(out["entry"][out["closes"]])
        start += n
    return torch.cat(entries)


@pytest.mark.parametrize("kind", ["csa", "hca"])
@pytest.mark.parametrize("chunks", [[45], [6, 1, 13, 2, 23]])
def test_window_compress_matches_the_compressors(kind: str, chunks: list[int]) -> None:
    cls, ratio = (
        (M.DeepseekV4CSACompressor, CFG.text.csa_ratio)
        if kind == "csa"
        else (M.DeepseekV4HCACompressor, CFG.text.hca_ratio)
    )
    module = cls(HF).float()
    _randomize(module, seed=ratio)
    h = torch.randn(1, sum(chunks), CFG.text.hidden_size, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        if kind == "csa":
            entries = module(
                h, torch.zeros(1, sum(chunks), CFG.text.q_lora_rank), torch.arange(sum(chunks))[None], None, 0
            )[0]
        else:
            entries = module(h, None, torch.arange(sum(chunks))[None], None, 0)[0]
    want = entries[0, 0]  # [windows, head_dim]
    got = _ours(module, ratio, kind == "csa", h[0], chunks)
    assert got.shape == want.shape and want.shape[0] >= 2
    assert float((got - want).abs().max()) <= TOL * float(want.abs().max())


def test_hc_head_matches_the_hyper_head() -> None:
    from dsgraph.models.deepseek_v4.model import _hc_head
    from dsgraph.models.deepseek_v41.context import Forward
    from dsgraph.models.deepseek_v41.numerics import REFERENCE

    t = CFG.text
    head = M.DeepseekV4HyperHead(HF).float()
    _randomize(head, seed=3)
    x = torch.randn(9, t.hc_mult, t.hidden_size, generator=torch.Generator().manual_seed(1))

    def collapse(x, fn, base, scale):  # type: ignore[no-untyped-def]
        weights = {"hc_head_fn": fn, "hc_head_base": base, "hc_head_scale": scale}
        pre = _hc_head(Forward(t, REFERENCE, weights, {}, {}), x)  # type: ignore[arg-type]
        return op.hc_collapse(x, pre)

    n, hidden = t.hc_mult, t.hidden_size
    graph = make_graph(
        collapse, tt((T, n, hidden), "f32"), tt((n, n * hidden), "f32"), tt((n,), "f32"), tt((1,), "f32")
    )
    got = run_graph(graph, [x, head.hc_fn.detach(), head.hc_base.detach(), head.hc_scale.detach()])
    with torch.no_grad():
        want = head(x[None])[0]
    got = next(iter(got.values()))
    assert float((got - want).abs().max()) <= TOL * float(want.abs().max())


def test_hash_routing_matches_the_hash_router() -> None:
    t = CFG.text
    router = M.DeepseekV4HashRouter(HF).float()
    _randomize(router, seed=5)
    gen = torch.Generator().manual_seed(2)
    router.tid2eid.copy_(
        torch.rand(t.vocab_size, t.n_routed_experts, generator=gen).argsort(1)[:, : t.num_experts_per_tok]
    )
    u = torch.randn(12, t.hidden_size, generator=gen)
    ids = torch.randint(0, t.vocab_size, (12,), generator=gen)
    bias = _hash_bias("tid2eid", router.tid2eid, t.n_routed_experts)

    def route(u, w, table, ids):  # type: ignore[no-untyped-def]
        weights, experts = op.moe_route(
            u,
            w,
            op.gather_rows(table, ids),
            topk=t.num_experts_per_tok,
            routed_scaling=t.routed_scaling_factor,
        )
        return {"weights": weights, "ids": experts}

    graph = make_graph(
        route,
        tt((T, t.hidden_size), "f32"),
        tt((t.n_routed_experts, t.hidden_size), "f32"),
        tt((t.vocab_size, t.n_routed_experts), "f32"),
        tt((T,)),
    )
    got = run_graph(graph, [u, router.weight.detach(), bias, ids.int()])
    with torch.no_grad():
        _, want_w, want_ids = router(u[None], ids[None])
    order = want_ids.argsort(1)
    mine = got["ids"].long().argsort(1)
    assert torch.equal(got["ids"].long().gather(1, mine), want_ids.gather(1, order))
    assert float((got["weights"].gather(1, mine) - want_w.gather(1, order)).abs().max()) <= 1e-6
