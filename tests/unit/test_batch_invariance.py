"""The cpu reference is batch invariant: a token's logits and cache entries are the same bits whatever
else shares its steps and however its sequence is chunked (platform/cpu/invariant.py, step_rows.py).

For the tiny and wide configs, in both numerics modes, a 40-token prompt runs alone in one step, then
one decode token. The same prompt also runs in chunks of 1, 5 and 17 tokens; those three requests and
another request with other tokens (first in the batch on even steps, last on odd ones) share every
step, the decode step included. Every chunked request must reproduce the one-step logits, the SWA ring
and compressor state of its slot, and its compressed-KV and indexer-key pool pages bit for bit.

The tiny models do not reach every size-dependent kernel path (their widths are multiples of 16), so
the row-wise ops whose torch kernels depend on size are also checked one by one at odd widths: a row
computed alone or in a part of the batch equals the same row computed in the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dsgraph.graph import TensorType as TT
from dsgraph.graph import make_graph
from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING, Numerics
from dsgraph.ops import engram as EG
from dsgraph.ops import moe as M
from dsgraph.ops import op
from dsgraph.platform.cpu.interpret import run_graph
from dsgraph.runtime.step_runner import StepRunner
from tests.oracle import model_fixtures as fx

PROMPT_LEN = 40
CHUNKS = (1, 5, 17)
WHOLE, OTHER = 0, 1  # request ids; the chunked requests are 10 + chunk size
OTHER_CHUNK = 3


def _run_whole(runner: StepRunner, prompt: list[int], decode: int) -> torch.Tensor:
    runner.add(WHOLE)
    logits = runner.step([(WHOLE, prompt)])[0]
    return torch.cat((logits, runner.step([(WHOLE, [decode])])[0]))


def _run_chunked(runner: StepRunner, prompt: list[int], decode: int) -> dict[int, torch.Tensor]:
    """Logits [PROMPT_LEN + 1, V] of each chunked request; OTHER shares every step."""
    rids = [10 + c for c in CHUNKS]
    for rid in (OTHER, *rids):
        runner.add(rid)
    outs: dict[int, list[torch.Tensor]] = {rid: [] for rid in rids}
    for k in range(PROMPT_LEN + 1):
        mine = [(10 + c, prompt[k * c : (k + 1) * c]) for c in CHUNKS if k * c < PROMPT_LEN]
        if k == PROMPT_LEN:  # every request decodes the same token in the last step
            mine = [(rid, [decode]) for rid in rids]
        other = (OTHER, fx.prompt(100 + k, OTHER_CHUNK))
        chunks = [other, *mine] if k % 2 == 0 else [*mine, other]
        for (rid, _), logits in zip(chunks, runner.step(chunks), strict=True):
            if rid != OTHER:
                outs[rid].append(logits)
    return {rid: torch.cat(parts) for rid, parts in outs.items()}


def _request_cache(runner: StepRunner, rid: int, name: str) -> torch.Tensor:
    """The part of cache `name` that request `rid` owns: its slot, or its pages of a paged pool."""
    req, first_dim = runner.requests[rid], runner.model.cache_types()[name].shape[0]
    if first_dim == "slots":
        return runner.caches[name][req.slot]
    ratio = int(str(first_dim).removeprefix("blocks"))
    return runner.caches[name][req.pages[ratio]]


def _check(name: str, num: Numerics, root: Path) -> None:
    model_dir = fx.checkpoint(name, str(root))
    prompt, decode = fx.prompt(5, PROMPT_LEN), 77
    runner = fx.runner(model_dir, num)
    want = _run_whole(runner, prompt, decode)
    for rid, got in _run_chunked(runner, prompt, decode).items():
        where = f"{name} {num.mode}, chunks of {rid - 10}"
        diff = float((got.float() - want.float()).abs().max())
        assert torch.equal(got, want), f"{where}: logits differ from the one-step run by up to {diff}"
        for cache in runner.caches:
            assert torch.equal(_request_cache(runner, rid, cache), _request_cache(runner, WHOLE, cache)), (
                f"{where}: cache {cache} differs from the one-step run"
            )


@pytest.mark.parametrize("num", [REFERENCE, SERVING], ids=lambda n: n.mode)
@pytest.mark.parametrize("name", ["tiny", "wide"])
def test_cpu_reference_is_batch_invariant(
    name: str, num: Numerics, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check(name, num, tmp_path_factory.getbasetemp() / "batch_invariance")


# ---- single ops at odd widths: (graph function, row-wise operand shapes, shared operands) ----

ROWS, WIDTH = 37, 13  # 37 rows of 13: vector bodies and scalar tails at many offsets
_GEN = torch.Generator().manual_seed(5)
IDS = ()  # marks a row-wise i32 operand: rope positions, engram_gate token ids (-1 masks row 0)
OPS: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]], list[torch.Tensor]]] = {
    "exp": (op.exp, [(WIDTH,)], []),
    "log": (lambda x: op.log(op.exp(x)), [(WIDTH,)], []),
    "sigmoid": (op.sigmoid, [(WIDTH,)], []),
    "silu": (op.silu, [(WIDTH,)], []),
    "softplus": (op.softplus, [(WIDTH,)], []),
    "softmax_last": (lambda x: op.softmax(x, axis=-1), [(3, WIDTH)], []),
    "softmax_middle": (lambda x: op.softmax(x, axis=1), [(2, 24)], []),  # torch: vectorized across the 24
    "reduce_sum_middle": (lambda x: op.reduce_sum(x, axes=(1,)), [(5, WIDTH)], []),
    "rms_norm": (lambda x, w: op.rms_norm(x, w, eps=1e-6), [(WIDTH,)], [torch.rand(WIDTH, generator=_GEN)]),
    "hc_collapse_expand": (
        lambda x, y, a, c: {
            "expand": op.hc_expand(y, x, a, c),
            "collapse": op.hc_collapse(x, a, out_dtype="f32"),
        },
        [(4, WIDTH), (WIDTH,), (4,), (4, 4)],
        [],
    ),
    "swiglu": (lambda g, v: M.swiglu(g, v, limit=1.5), [(WIDTH,), (WIDTH,)], []),
    "moe_route": (
        lambda u, w, b: M.moe_route(u, w, b, topk=3, routed_scaling=2.5),
        [(16,)],
        [torch.randn(WIDTH, 16, generator=_GEN), torch.randn(WIDTH, generator=_GEN) * 0.1],
    ),
    "matmul": (op.matmul, [(6, 16), (16, 9)], []),
    "linear": (op.linear, [(40,)], [torch.randn(WIDTH, 40, generator=_GEN)]),
    "rope": (lambda x, p: op.rope(x, p, rope_dim=6, theta=1e4), [(10,), IDS], []),
    "hc_pre": (
        lambda x, f, b, s: op.hc_pre(x, f, b, s, sinkhorn_iters=20, eps=1e-6, norm_eps=1e-6),
        [(4, 16)],
        [
            torch.randn(24, 64, generator=_GEN) * 0.1,
            torch.randn(24, generator=_GEN),
            torch.tensor([0.5, 1.5, 2.0]),
        ],
    ),
    "engram_gate": (
        lambda x, kv, ids, qw, kw: EG.engram_gate(x, kv, qw, kw, ids, eps=1e-6, image_token_id=-1),
        [(2, WIDTH), (3 * WIDTH,), IDS],
        [torch.rand(2, WIDTH, generator=_GEN) + 0.5, torch.rand(2, WIDTH, generator=_GEN) + 0.5],
    ),
}


def _row_operand(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if shape == IDS:
        return (torch.arange(ROWS) * 3701 % 10007 - 1).int()
    return torch.randn(ROWS, *shape, generator=gen) * 4


@pytest.mark.parametrize("name", sorted(OPS))
def test_row_ops_do_not_depend_on_the_batch(name: str) -> None:
    fn, row_shapes, shared = OPS[name]
    types = [TT(("tokens", *shape), "i32" if shape == IDS else "f32") for shape in row_shapes]
    graph = make_graph(fn, *types, *(TT(tuple(t.shape), "f32") for t in shared))
    gen = torch.Generator().manual_seed(11)
    rows = [_row_operand(shape, gen) for shape in row_shapes]
    whole = run_graph(graph, [*rows, *shared])
    for part in [slice(t, t + 1) for t in range(ROWS)] + [slice(5, 22), slice(1, ROWS)]:
        got = run_graph(graph, [*(r[part].clone() for r in rows), *shared])
        for key, value in got.items():
            assert torch.equal(value, whole[key][part]), f"{name}: output {key} of rows {part} differs"
