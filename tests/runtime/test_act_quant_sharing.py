"""FP8-g32 activation quantization as one op per activation (models/deepseek_v41/context.py
`act_quantize`): the linears reading one activation read one `act_qdq`, which CSE leaves once in the
graph the runtime lowers (graph.passes.optimize), and the step computes exactly what a linear that
quantizes its own input (`act_quant fp8_g32`) computes."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest
import torch

from dsgraph import EngineConfig, Session
from dsgraph.graph import Graph, verify
from dsgraph.graph.ir import Eqn, Var
from dsgraph.graph.passes import dce
from dsgraph.models.deepseek_v41.layers_plan import LayerMode
from dsgraph.tools.generate_cmd import default_model_dir

CONFIG = EngineConfig.from_flat(max_model_len=64, max_num_seqs=2)
PROMPTS = ([3, 5, 7, 11, 13, 17, 19], [2, 4, 6, 8, 10])
LINEARS = ("linear", "grouped_linear")

# The FP8-g32 quantizations of one decoder layer in serving numerics, one per distinct activation: the
# attention input (wq_a, wkv), the q latent (wq_b, and the indexer's wq_b in index layers), the SWA key
# (its cache entry), the wo_a input, the wo_b input, the FFN input (shared expert w1, w3) and the w2 input.
# The routed experts quantize their dispatched rows inside moe_experts.
QDQ_PER_LAYER = 7


def _is_fp8_qdq(eqn: Eqn) -> bool:
    return eqn.op == "act_qdq" and eqn.params.fmt == "fp8_g32"


def own_quant(graph: Graph) -> Graph:
    """`graph` with every FP8 linear quantizing its own input again (act_quant fp8_g32 over the input of
    the act_qdq it read): one quantization per linear, as before the shared op."""
    source = {e.outputs[0].id: e for e in graph.eqns if _is_fp8_qdq(e) and e.params.out_dtype == "bf16"}
    eqns = []
    for eqn in graph.eqns:
        x = eqn.inputs[0]
        if eqn.op in LINEARS and isinstance(x, Var) and x.id in source:
            params = dataclasses.replace(eqn.params, act_quant="fp8_g32")
            eqn = dataclasses.replace(eqn, inputs=(source[x.id].inputs[0], *eqn.inputs[1:]), params=params)
        eqns.append(eqn)
    return verify(dce(dataclasses.replace(graph, eqns=tuple(eqns))))


def fp8_qdq_per_layer(graph: Graph) -> Counter[int]:
    """Decoder layer -> its FP8-g32 quantizations: act_qdq equations and linears quantizing their own
    input, each counted in the layer of the next equation that reads one of its weights."""
    names = {v.id: n for v, n in zip(graph.inputs, graph.input_names, strict=True)}

    def layer(eqn: Eqn) -> int | None:
        for a in eqn.inputs:
            m = re.match(r"weights\.layers\.(\d+)\.", names.get(a.id, "") if isinstance(a, Var) else "")
            if m:
                return int(m.group(1))
        return None

    counts: Counter[int] = Counter()
    pending = 0
    for eqn in graph.eqns:
        own = eqn.op in LINEARS and eqn.params.act_quant == "fp8_g32"
        pending += _is_fp8_qdq(eqn) or own
        at = layer(eqn)
        if at is not None and pending:
            counts[at] += pending
            pending = 0
    return counts


@pytest.fixture(scope="module")
def session() -> Session:
    return Session.from_checkpoint(default_model_dir(), CONFIG)


def test_one_fp8_quantization_per_activation(session: Session) -> None:
    graph, layers = session.graph, session.model.cfg.text.num_hidden_layers
    assert not [e for e in graph.eqns if e.op in LINEARS and e.params.act_quant != "none"]
    inputs = Counter(e.inputs[0].id for e in graph.eqns if _is_fp8_qdq(e))
    assert max(inputs.values()) == 1
    assert fp8_qdq_per_layer(graph) == Counter({i: QDQ_PER_LAYER for i in range(layers)})
    # one per linear again: wkv, the shared expert's w3 and, in index layers, the indexer's wq_b
    index_layers = sum(p.mode in (LayerMode.FULL, LayerMode.REINDEX) for p in session.model.plans)
    again = own_quant(graph)
    assert sum(fp8_qdq_per_layer(again).values()) == layers * (QDQ_PER_LAYER + 2) + index_layers


def _steps(session: Session) -> list[torch.Tensor]:
    """Logits of a prefill of both prompts and four greedy decode steps, then the caches."""
    seqs = [session.open_sequence() for _ in PROMPTS]
    builder = session.new_step()
    for seq, prompt in zip(seqs, PROMPTS, strict=True):
        builder.add(seq, prompt)
    out = [session.run(builder.build()).clone()]
    for _ in range(4):
        builder = session.new_step()
        for seq, row in zip(seqs, out[-1], strict=True):
            builder.add(seq, [int(row.argmax())])
        out.append(session.run(builder.build()).clone())
    for seq in seqs:
        session.close_sequence(seq)
    return out + [session.caches[name].clone() for name in sorted(session.caches)]


def test_shared_quantization_is_bit_equal_to_one_per_linear(session: Session) -> None:
    other = Session.from_checkpoint(default_model_dir(), CONFIG)
    other.graph = own_quant(other.graph)
    other.graphs = {False: other.graph}
    assert sum(e.op in LINEARS and e.params.act_quant == "fp8_g32" for e in other.graph.eqns) > 0
    for got, want in zip(_steps(session), _steps(other), strict=True):
        assert got.dtype == want.dtype
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
