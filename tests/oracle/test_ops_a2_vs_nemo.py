"""Group A2 ops against NeMo AutoModel 0.7.0 on CPU in FP32 (the independent oracle).

moe_route vs the V4 gate (`DeepseekV4VisionGate`, as V4.1 builds it); moe_experts vs `GroupedExperts`
(per-expert loop, clamped SwiGLU) with weights decoded by NeMo's checkpoint dequantizer; swiglu vs
NeMo's shared-expert `MLP`; engram_hash vs `DeepseekV41NgramHash`; gather_dequant_rows + linear +
engram_gate vs `DeepseekV41Engram`. Each at the tiny config's sizes and at one other size.
act_quant="fp8_g32" has no NeMo counterpart (NeMo never quantizes GEMM inputs, numerics 2d); the unit
tests check it against a hand reference.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pytest

pytest.importorskip("nemo_automodel")

import torch  # noqa: E402
from nemo_automodel.components.models.common import BackendConfig  # noqa: E402
from nemo_automodel.components.models.deepseek_v4.config import DeepseekV4Config  # noqa: E402
from nemo_automodel.components.models.deepseek_v4.model import DeepseekV4VisionGate  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41TextConfig  # noqa: E402
from nemo_automodel.components.models.deepseek_v41.engram import (  # noqa: E402
    DeepseekV41Engram,
    DeepseekV41NgramHash,
)
from nemo_automodel.components.models.deepseek_v41.state_dict_adapter import (  # noqa: E402
    dequantize_checkpoint_weight,
)
from nemo_automodel.components.moe.config import MoEConfig  # noqa: E402
from nemo_automodel.components.moe.experts import GroupedExperts, swiglu_clamped_deepep  # noqa: E402
from nemo_automodel.components.moe.layers import MLP  # noqa: E402

import dsgraph.ops  # noqa: E402, F401
from dsgraph.graph import TensorType, make_graph  # noqa: E402
from dsgraph.models.deepseek_v41.engram_hash import EngramSpec, engram_primes  # noqa: E402
from dsgraph.models.deepseek_v41.engram_map import build_token_map  # noqa: E402
from dsgraph.ops import engram as EG  # noqa: E402
from dsgraph.ops import moe as M  # noqa: E402
from dsgraph.ops import nn as N  # noqa: E402
from dsgraph.ops import shape as S  # noqa: E402
from dsgraph.platform.cpu.dtypes import to_ir  # noqa: E402
from dsgraph.platform.cpu.interpret import run_graph  # noqa: E402
from tests.oracle.test_engram_vs_nemo import TINY_TEXT, tiny_fast_tokenizer  # noqa: E402

_BACKEND = BackendConfig(
    attn="sdpa", linear="torch", rms_norm="torch_fp32", rope="torch", experts="torch", dispatcher="torch"
)
# (tokens, hidden, experts, topk, intermediate): the tiny config, and the real router/expert counts.
MOE_SIZES = [(9, 64, 8, 2, 32), (5, 256, 384, 6, 96)]


def _ty(t: torch.Tensor, first: str | None = None) -> TensorType:
    return TensorType((first, *t.shape[1:]) if first else tuple(t.shape), to_ir(t.dtype))


def _moe_config(hidden: int, experts: int, k: int, inter: int) -> MoEConfig:
    return MoEConfig(
        dim=hidden, inter_dim=inter, moe_inter_dim=inter, n_routed_experts=experts, n_shared_experts=1,
        n_activated_experts=k, n_expert_groups=0, n_limited_groups=0, train_gate=True,
        gate_bias_update_factor=0.0, aux_loss_coeff=0.0, score_func="sqrtsoftplus", route_scale=1.5,
        norm_topk_prob=True, router_weights_fp32=True, force_e_score_correction_bias=True,
        swiglu_limit=10.0, dtype=torch.float32,
    )  # fmt: skip


def _nemo_gate(cfg: MoEConfig, gen: torch.Generator) -> DeepseekV4VisionGate:
    gate = DeepseekV4VisionGate(
        DeepseekV4Config(vocab_size=256), cfg, gate_precision=torch.float32, hash_routing=False
    )
    with torch.no_grad():
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=gen) * 0.1)
        gate.e_score_correction_bias.copy_(torch.randn(cfg.n_routed_experts, generator=gen) * 0.1)
        gate.bias_vl.copy_(torch.randn(cfg.n_routed_experts, generator=gen) * 0.1)
    return gate


@pytest.mark.parametrize("size", MOE_SIZES)
def test_moe_route_matches_nemo_gate(size: tuple[int, ...]) -> None:
    tokens, hidden, experts, k, inter = size
    gen = torch.Generator().manual_seed(tokens)
    gate = _nemo_gate(cfg := _moe_config(hidden, experts, k, inter), gen)
    u = torch.randn(tokens, hidden, generator=gen)
    image = torch.zeros(tokens, dtype=torch.bool)
    image[1::3] = True  # image rows select with bias_vl
    gate.set_routing_context(None, torch.where(image, 1, -1)[None])
    want_w, want_ids, _ = gate(u, torch.ones(tokens, dtype=torch.bool), None)
    bias = torch.where(image[:, None], gate.bias_vl, gate.e_score_correction_bias)

    def f(u, w, b):  # type: ignore[no-untyped-def]
        return M.moe_route(u, w, b, topk=cfg.n_activated_experts, routed_scaling=cfg.route_scale)

    g = make_graph(f, _ty(u, "tokens"), _ty(gate.weight.detach()), _ty(bias, "tokens"))
    got = run_graph(g, [u, gate.weight.detach(), bias])
    assert torch.equal(got["1"].long(), want_ids)
    torch.testing.assert_close(got["0"], want_w, rtol=1e-5, atol=0)


def _random_fp4_expert_weights(
    experts: int, rows: int, cols: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed E2M1 bytes and UE8M0 row scales (2^-9 .. 2^-4), as released experts store them."""
    packed = torch.randint(-128, 128, (experts, rows, cols // 2), generator=gen, dtype=torch.int8)
    exps = torch.randint(118, 124, (experts, rows, cols // 32), generator=gen, dtype=torch.uint8)
    return packed, exps.view(torch.float8_e8m0fnu)


def _nemo_decode(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return dequantize_checkpoint_weight(packed, scale, dtype=torch.float32)


def _zeros_like_decoded(packed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(packed.shape[0], packed.shape[1] * 2)


def _nemo_experts(cfg: MoEConfig, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> GroupedExperts:
    """NeMo's stacked layout: gate_and_up [E, H, 2I] = [w1^T | w3^T], down [E, I, H] = w2^T."""
    experts = GroupedExperts(cfg, backend=_BACKEND)
    # NeMo wraps the activation in torch.compile; inductor on CPU costs ~4 s per shape. Run the same
    # NeMo function eagerly instead (after checking that it is the one NeMo picked).
    activation = experts.expert_activation_grouped
    assert activation.func is swiglu_clamped_deepep and activation.keywords == {"limit": cfg.swiglu_limit}
    experts.expert_activation_grouped = partial(swiglu_clamped_deepep.__wrapped__, limit=cfg.swiglu_limit)
    with torch.no_grad():
        experts.gate_and_up_projs.copy_(torch.cat([w1.transpose(1, 2), w3.transpose(1, 2)], dim=-1))
        experts.down_projs.copy_(w2.transpose(1, 2))
    return experts


@pytest.mark.parametrize("weight_format", ["dense", "mxfp4_rows"])
@pytest.mark.parametrize("size", MOE_SIZES)
def test_moe_experts_match_nemo_grouped_experts(size: tuple[int, ...], weight_format: str) -> None:
    tokens, hidden, experts, k, inter = size
    gen = torch.Generator().manual_seed(100 + tokens)
    cfg = _moe_config(hidden, experts, k, inter)
    x = torch.randn(tokens, hidden, generator=gen)
    weights = torch.rand(tokens, k, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    valid = torch.ones(tokens, dtype=torch.bool)
    valid[2] = False  # a padding row: NeMo masks it out, dsgraph marks it with ids -1
    if weight_format == "dense":
        ws = [torch.randn(experts, inter, hidden, generator=gen) for _ in range(2)]
        ws.append(torch.randn(experts, hidden, inter, generator=gen) * 0.2)
        operands, dense = ws, ws
    else:
        q1, s1 = _random_fp4_expert_weights(experts, inter, hidden, gen)
        q3, s3 = _random_fp4_expert_weights(experts, inter, hidden, gen)
        q2, s2 = _random_fp4_expert_weights(experts, hidden, inter, gen)
        operands = [q1, q3, q2, s1, s3, s2]
        # NeMo decodes the experts a row selects; the others never run (zeros keep the test fast).
        used = set(ids[valid].unique().tolist())
        dense = [
            torch.stack(
                [_nemo_decode(q[e], s[e]) if e in used else _zeros_like_decoded(q[e]) for e in range(experts)]
            )
            for q, s in ((q1, s1), (q3, s3), (q2, s2))
        ]
    with torch.no_grad():
        want = _nemo_experts(cfg, *dense)(x, valid, weights, ids)
    my_ids = torch.where(valid[:, None], ids, -1).to(torch.int32)

    def f(x, ids, weights, *ws):  # type: ignore[no-untyped-def]
        return M.moe_experts(x, ids, weights, *ws, swiglu_limit=10.0, weight_format=weight_format)

    types = [_ty(x, "tokens"), _ty(my_ids, "tokens"), _ty(weights, "tokens"), *(_ty(w) for w in operands)]
    got = run_graph(make_graph(f, *types), [x, my_ids, weights, *operands])["out"]
    assert torch.equal(got[2], torch.zeros(hidden))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("hidden,inter", [(64, 32), (256, 96)])
def test_shared_expert_graph_matches_nemo_mlp(hidden: int, inter: int) -> None:
    gen = torch.Generator().manual_seed(hidden)
    mlp = MLP(hidden, inter, "torch", dtype=torch.float32, swiglu_limit=10.0)
    with torch.no_grad():
        for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * 0.5)
    x = torch.randn(7, hidden, generator=gen) * 2.0
    w1, w3, w2 = (lin.weight.detach() for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    assert float((x @ w1.T).max()) > 10  # the clamp is exercised

    def shared(x, w1, w3, w2):  # type: ignore[no-untyped-def]
        return N.linear(M.swiglu(N.linear(x, w1), N.linear(x, w3), limit=10.0), w2)

    got = run_graph(make_graph(shared, _ty(x, "tokens"), _ty(w1), _ty(w3), _ty(w2)), [x, w1, w3, w2])["out"]
    with torch.no_grad():
        want = mlp(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


# ---- Engram ----

# The tiny config, and another shape (3 heads, orders 2..3, other layers and bucket primes).
OTHER_TEXT = {**TINY_TEXT, "engram_layer_ids": [1, 5], "engram_num_embeddings": [660, 864],
              "engram_max_ngram_size": 3, "engram_vocab_size": 100, "engram_n_heads": 3}  # fmt: skip
IMAGE_TOKEN = 254


def _engram_params(text: dict[str, Any], k: int, token_map: list[int]) -> dict[str, Any]:
    """What the backbone passes to engram_hash for Engram layer index k (see the lead's report)."""
    spec = EngramSpec.from_dict(text)
    layer = engram_primes(spec)[k]
    return dict(
        primes=layer.primes, offsets=layer.offsets, multipliers=layer.multipliers,
        pad_id=token_map[spec.pad_token_id], max_ngram=spec.max_ngram, image_token_id=IMAGE_TOKEN,
    )  # fmt: skip


def _step(
    seqs: np.ndarray, chunks: list[tuple[int, int]], history: int, token_map: list[int]
) -> list[torch.Tensor]:
    """Chunk [a, b) of every sequence, a padding row after each, lookback most recent first."""
    ids, pos, sid, starts, back = [], [], [], [], []
    for s, (a, b) in enumerate(chunks):
        ids += seqs[s, a:b].tolist() + [0]
        pos += list(range(a, b)) + [0]
        sid += [s] * (b - a) + [-1]
        starts.append(a)
        back.append([int(seqs[s, a - 1 - j]) if a - 1 - j >= 0 else -1 for j in range(history)])
    cols = [ids, pos, sid, starts, back, token_map]
    return [torch.tensor(c, dtype=torch.int32) for c in cols]


def _run_hash(step: list[torch.Tensor], p: dict[str, Any]) -> torch.Tensor:
    def f(ids, pos, sid, start, back, tmap):  # type: ignore[no-untyped-def]
        return EG.engram_hash(ids, pos, sid, start, back, tmap, **p)

    types = [_ty(t, "tokens") for t in step[:3]] + [_ty(t, "seqs") for t in step[3:5]] + [_ty(step[5])]
    return run_graph(make_graph(f, *types), step)["out"]


@pytest.mark.parametrize("text", [TINY_TEXT, OTHER_TEXT], ids=["tiny", "other"])
def test_engram_hash_matches_nemo(text: dict[str, Any]) -> None:
    fast = tiny_fast_tokenizer()
    nemo = DeepseekV41NgramHash(DeepseekV41TextConfig(**text), fast)
    token_map, _ = build_token_map(fast.backend_tokenizer)
    rng = np.random.default_rng(17)
    seqs = rng.integers(0, 256, size=(3, 24))
    seqs[1, [4, 10, 11]] = IMAGE_TOKEN
    ref = nemo(torch.tensor(seqs), token_mask=torch.tensor(seqs != IMAGE_TOKEN))  # [3, 24, layers, rows]
    history = text["engram_max_ngram_size"] - 1
    for chunks in ([(0, 24), (0, 9), (0, 1)], [(20, 21), (9, 16), (1, 24)], [(23, 24), (16, 24), (5, 6)]):
        step = _step(seqs, chunks, history, token_map)
        real = step[2] >= 0
        want = torch.cat([ref[s, a:b] for s, (a, b) in enumerate(chunks)])
        for k in range(len(text["engram_layer_ids"])):
            got = _run_hash(step, _engram_params(text, k, token_map))
            assert torch.equal(got[real], want[:, k]), f"layer {k} chunks {chunks}"
            assert torch.equal(got[~real], torch.zeros_like(got[~real]))


def _nemo_engram(text: dict[str, Any], hidden: int, gen: torch.Generator) -> DeepseekV41Engram:
    cfg = DeepseekV41TextConfig(**text, hidden_size=hidden, hc_mult=4, dtype="float32", rms_norm_eps=1e-20)
    module = DeepseekV41Engram(cfg, text["engram_layer_ids"][0], _BACKEND)
    with torch.no_grad():
        module.wkv.weight.copy_(torch.randn(module.wkv.weight.shape, generator=gen) * 0.05)
        module.q_weight.copy_(torch.rand(module.q_weight.shape, generator=gen) + 0.5)
        module.k_weight.copy_(torch.rand(module.k_weight.shape, generator=gen) + 0.5)
    return module


@pytest.mark.parametrize(
    "text,hidden,dim", [(TINY_TEXT, 64, 32), (OTHER_TEXT, 128, 64)], ids=["tiny", "other"]
)
def test_engram_rows_linear_gate_match_nemo(text: dict[str, Any], hidden: int, dim: int) -> None:
    text = {**text, "engram_head_dim": dim}
    gen = torch.Generator().manual_seed(hidden)
    nemo = _nemo_engram(text, hidden, gen)
    num_rows = text["engram_num_embeddings"][0]
    table = (torch.randn(num_rows, dim, generator=gen) * 8).to(torch.float8_e4m3fn)
    scale = torch.randint(120, 127, (num_rows, dim // 32), generator=gen, dtype=torch.uint8).view(
        torch.float8_e8m0fnu
    )
    with torch.no_grad():
        nemo.embed.weight.copy_(dequantize_checkpoint_weight(table, scale, dtype=torch.float32, rowwise=True))
    tokens, streams, per_token = 6, 4, nemo.hash_heads
    x = torch.randn(1, tokens, streams, hidden, generator=gen)
    rows = torch.randint(0, num_rows, (1, tokens, per_token), generator=gen)
    token_ids = torch.tensor([5, IMAGE_TOKEN, 7, 8, IMAGE_TOKEN, 9], dtype=torch.int32)
    with torch.no_grad():
        want = nemo(x, rows, token_mask=(token_ids != IMAGE_TOKEN)[None])[0]
    qw, kw, wkv = (t.detach() for t in (nemo.q_weight, nemo.k_weight, nemo.wkv.weight))

    def engram(x, table, scale, rows, wkv, qw, kw, token_ids):  # type: ignore[no-untyped-def]
        e = EG.gather_dequant_rows(table, scale, rows)  # [tokens, J, D]
        kv = N.linear(S.reshape(e, shape=("tokens", per_token * dim)), wkv)
        return EG.engram_gate(x, kv, qw, kw, token_ids, eps=1e-20, image_token_id=IMAGE_TOKEN)

    args = [x[0], table, scale, rows[0], wkv, qw, kw, token_ids]
    types = [_ty(x[0], "tokens"), _ty(table), _ty(scale), _ty(rows[0], "tokens"), _ty(wkv), _ty(qw), _ty(kw)]
    got = run_graph(make_graph(engram, *types, _ty(token_ids, "tokens")), args)["out"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], x[0, 1]) and not torch.equal(got[0], x[0, 0])
