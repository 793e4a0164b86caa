"""Lowering-time fusion: pairs of equations that a platform's kernels run as one launch become one
equation of a fused op (ops/fused.py), with the same values. On for a platform with `Platform.fuse`
(the cuda platform); `lower` applies `fuse` before ordering for in-place writes.

The models emit one equation per step of the arithmetic and leave sharing to CSE; these rewrites then
merge, in order:
1. `hc_expand` and the `hc_pre` of the streams it wrote -> `hc_expand_pre` (at the expand's place; the
   pre's weights are graph inputs);
2. `hc_collapse` read only by an `rms_norm` -> `hc_collapse_norm` (at the norm's place);
3. `rms_norm` read only by a `rope` -> `rms_norm_rope` (at the rope's place);
4. `cache_encode` read only by a `swa_write` / `paged_write` -> `encode_swa_write` /
   `encode_paged_write` (at the write's place); a `compress` whose latent only an `rms_norm` reads ->
   `compress_norm` (at the compress's place: its closes and state may have readers before the norm);
5. two `linear`s of block-scaled weights that read one activation with the same params ->
   `linear_pair` (at the first one's place), in equation order;
6. an `act_qdq` of a fusable op's output -> `<op>_qdq`, which also writes the op's own output where
   anything else reads it (`raw`). One act_qdq folds per op (CSE leaves at most one per format).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from dsgraph.graph.ir import Eqn, Graph, Var
from dsgraph.graph.op import get_op
from dsgraph.ops.fused import FUSED_QDQ, CompressNormParams, HcCollapseNormParams, RMSNormRopeParams

__all__ = ["fuse", "fuse_qdq"]


def _fields(params: Any) -> dict[str, Any]:
    """An equation's params as keyword arguments (a fused op's params extend its producers')."""
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


def _readers(graph: Graph) -> Counter:
    """var id -> how many equation operands and graph outputs read it."""
    count: Counter = Counter(a.id for e in graph.eqns for a in e.inputs if isinstance(a, Var))
    count.update(a.id for a in graph.outputs if isinstance(a, Var))
    return count


def _defined_at(graph: Graph) -> dict[int, int]:
    """var id -> the index of the equation that defines it (-1: a graph input)."""
    at = {v.id: -1 for v in graph.inputs}
    at.update((o.id, k) for k, e in enumerate(graph.eqns) for o in e.outputs)
    return at


def _ready_at(defined: dict[int, int], eqn: Eqn, index: int) -> bool:
    """Whether eqn's operands after its first are available before equation `index` (`_defined_at`)."""
    return all(defined[a.id] < index for a in eqn.inputs[1:] if isinstance(a, Var))


def _pairs(graph: Graph, first: str, second: str, operand: int = 0) -> list[tuple[int, int]]:
    """(i, j): equation j (op `second`) reads the first output of equation i (op `first`) as `operand`,
    each equation in one pair at most."""
    made = {e.outputs[0].id: i for i, e in enumerate(graph.eqns) if e.op == first}
    pairs, used = [], set()
    for j, e in enumerate(graph.eqns):
        x = e.inputs[operand] if e.op == second and len(e.inputs) > operand else None
        i = made.get(x.id) if isinstance(x, Var) else None
        if i is not None and i not in used:
            pairs.append((i, j))
            used.add(i)
    return pairs


def _rewrite(graph: Graph, merged: dict[int, Eqn], dropped: set[int]) -> Graph:
    if not merged:
        return graph
    eqns = tuple(merged.get(i, e) for i, e in enumerate(graph.eqns) if i not in dropped)
    return dataclasses.replace(graph, eqns=eqns)


def _fuse_sole_reader(graph: Graph, first: str, second: str, build: Any, operand: int = 0) -> Graph:
    """Each `first` equation whose output only a `second` equation reads (as `operand`) merged with it
    into `build(first_eqn, second_eqn)`, at the second's place."""
    readers = _readers(graph)
    merged, dropped = {}, set()
    for i, j in _pairs(graph, first, second, operand):
        if readers[graph.eqns[i].outputs[0].id] == 1:
            merged[j] = build(graph.eqns[i], graph.eqns[j])
            dropped.add(i)
    return _rewrite(graph, merged, dropped)


def fuse_expand_pre(graph: Graph) -> Graph:
    defined = _defined_at(graph)
    merged, dropped = {}, set()
    for i, j in _pairs(graph, "hc_expand", "hc_pre"):
        expand, pre = graph.eqns[i], graph.eqns[j]
        if not _ready_at(defined, pre, i):
            continue
        outs = (expand.outputs[0], *pre.outputs)
        merged[i] = Eqn("hc_expand_pre", expand.inputs + pre.inputs[1:], outs, pre.params, expand.source)
        dropped.add(j)
    return _rewrite(graph, merged, dropped)


def _collapse_norm(collapse: Eqn, norm: Eqn) -> Eqn:
    p = HcCollapseNormParams(eps=norm.params.eps, out_dtype=collapse.params.out_dtype)
    return Eqn("hc_collapse_norm", collapse.inputs + norm.inputs[1:], norm.outputs, p, norm.source)


def fuse_collapse_norm(graph: Graph) -> Graph:
    return _fuse_sole_reader(graph, "hc_collapse", "rms_norm", _collapse_norm)


def _norm_rope(norm: Eqn, rope: Eqn) -> Eqn:
    p = RMSNormRopeParams(**_fields(rope.params), eps=norm.params.eps)
    return Eqn("rms_norm_rope", norm.inputs + rope.inputs[1:], rope.outputs, p, rope.source)


def fuse_norm_rope(graph: Graph) -> Graph:
    return _fuse_sole_reader(graph, "rms_norm", "rope", _norm_rope)


def _encode_write(write: str) -> Any:
    def build(encode: Eqn, cache_write: Eqn) -> Eqn:
        inputs = (cache_write.inputs[0], encode.inputs[0], *cache_write.inputs[2:])
        return Eqn(f"encode_{write}", inputs, cache_write.outputs, encode.params, cache_write.source)

    return build


def fuse_encode_write(graph: Graph) -> Graph:
    for write in ("swa_write", "paged_write"):
        graph = _fuse_sole_reader(graph, "cache_encode", write, _encode_write(write), operand=1)
    return graph


def fuse_compress_norm(graph: Graph) -> Graph:
    readers, defined = _readers(graph), _defined_at(graph)
    merged, dropped = {}, set()
    for i, j in _pairs(graph, "compress", "rms_norm"):
        compress, norm = graph.eqns[i], graph.eqns[j]
        if readers[compress.outputs[0].id] != 1 or not _ready_at(defined, norm, i):
            continue
        p = CompressNormParams(
            ratio=compress.params.ratio, eps=norm.params.eps, out_dtype=compress.params.out_dtype
        )
        outs = (norm.outputs[0], *compress.outputs[1:])
        merged[i] = Eqn("compress_norm", (*compress.inputs, norm.inputs[1]), outs, p, compress.source)
        dropped.add(j)
    return _rewrite(graph, merged, dropped)


def fuse_linear_pairs(graph: Graph) -> Graph:
    defined = _defined_at(graph)
    open_pairs: dict[tuple, int] = {}  # (x id, params) -> the equation waiting for its partner
    merged, dropped = {}, set()
    for j, e in enumerate(graph.eqns):
        if e.op != "linear" or e.params.weight_format != "fp8_block32" or not isinstance(e.inputs[0], Var):
            continue
        key = (e.inputs[0].id, e.params)
        i = open_pairs.pop(key, None)
        if i is None:
            open_pairs[key] = j
            continue
        if not _ready_at(defined, e, i):
            continue
        first = graph.eqns[i]
        outs = (first.outputs[0], e.outputs[0])
        merged[i] = Eqn("linear_pair", first.inputs + e.inputs[1:], outs, first.params, first.source)
        dropped.add(j)
    return _rewrite(graph, merged, dropped)


def _with_qdq(producer: Eqn, qdq: Eqn, raw: bool) -> Eqn:
    name = FUSED_QDQ[producer.op]
    qdq_fields = dict(qdq_fmt=qdq.params.fmt, qdq_dtype=qdq.params.out_dtype, raw=raw)
    p = get_op(name).params_type(**_fields(producer.params), **qdq_fields)
    outs = (producer.outputs[0], qdq.outputs[0]) if raw else (qdq.outputs[0],)
    return Eqn(name, producer.inputs, outs, p, producer.source)


def fuse_qdq(graph: Graph) -> Graph:
    """Each act_qdq of a fusable op's (single) output folded into that op's equation."""
    readers = _readers(graph)
    merged, dropped = {}, set()
    for op in FUSED_QDQ:
        for i, j in _pairs(graph, op, "act_qdq"):
            y = graph.eqns[i].outputs[0]
            if len(graph.eqns[i].outputs) == 1:
                merged[i] = _with_qdq(graph.eqns[i], graph.eqns[j], raw=readers[y.id] > 1)
                dropped.add(j)
    return _rewrite(graph, merged, dropped)


def fuse(graph: Graph) -> Graph:
    """Every rewrite above, in order."""
    graph = fuse_encode_write(fuse_norm_rope(fuse_collapse_norm(fuse_expand_pre(graph))))
    graph = fuse_compress_norm(graph)
    return fuse_qdq(fuse_linear_pairs(graph))
