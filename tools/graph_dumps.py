"""Text dumps of the tiny V4.1 graphs at every stage: the process-replay goldens.

Four step kinds run the model: prefill and decode share the target step graph (they differ only in the
bucket it is specialized to), verify is the target step of a drafting session (it also writes the DSpark
context rings) specialized to a bucket of several rows per sequence, and draft is the DSpark drafter's
graph. Each is dumped as traced, after each graph pass (cse, then dce), specialized to its bucket the
way the runtime specializes it (`runtime/session.py` specializes the graph after both passes,
`graph.passes.optimize`), and lowered onto
the `null` and `cpu` platforms (the program: which rule each equation runs, then its memory plan).
The sampler's `sample` and `spec_verify` graphs follow the same stages.

The committed dumps live in `tests/golden/v41/`; `tests/golden/test_v41_golden.py` compares them (the
`cuda` programs: `tests/cuda/test_cuda_program_golden.py`, which runs wherever triton is installed, no
GPU needed); `pytest tests/golden tests/cuda/test_cuda_program_golden.py --update-goldens` rewrites
them. Source locations are left out of the dumps: a comment added to a model file moves line numbers
without changing what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from dsgraph.graph import Graph, format_graph, verify
from dsgraph.graph.passes import cse, dce, specialize
from dsgraph.models.deepseek_v41.config import parse_config
from dsgraph.models.deepseek_v41.engram_map import build_token_map
from dsgraph.models.deepseek_v41.step_io import default_geometry, ratios
from dsgraph.models.deepseek_v41.tiny import tiny_config_dict
from dsgraph.models.deepseek_v41.tokenizer_fixture import fixture_tokenizer
from dsgraph.platform.registry import lower
from dsgraph.tools.model_graphs import MetaModel, draft_graph, meta_model, step_graph

__all__ = [
    "DUMP_PLATFORMS",
    "GRAPHS",
    "GraphCase",
    "dump_graph",
    "golden_dumps",
    "golden_names",
    "stage_names",
    "tiny_graph",
]

MAX_MODEL_LEN, PAGE_SIZE, NUM_SLOTS = 64, 16, 2
DUMP_PLATFORMS = ("null", "cpu")


@dataclass(frozen=True)
class GraphCase:
    """One graph of the goldens and the buckets it is specialized to (bucket name -> dim sizes)."""

    name: str
    make: Callable[[], Graph]
    buckets: dict[str, dict[str, int]]


@cache
def _model(dspark: bool) -> MetaModel:
    """The tiny model (make-tiny's config and tokenizer) with its weights as meta tensors."""
    raw = tiny_config_dict()
    token_map, num_keys = build_token_map(fixture_tokenizer("tiny", raw["text_config"]["vocab_size"]))
    raw["text_config"]["engram_compressed_vocab_size"] = num_keys
    cfg = parse_config(raw)
    return meta_model(cfg, token_map, default_geometry(cfg.text, MAX_MODEL_LEN, PAGE_SIZE), dspark=dspark)


def _sampler_graphs() -> tuple[Graph, Graph]:
    from dsgraph.runtime.sampler import Sampler

    sampler = Sampler(_model(False)[0].cfg.text.vocab_size)
    return sampler.graphs["sample"], sampler.graphs["spec_verify"]


def _cache_sizes() -> dict[str, int]:
    model = _model(False)[0]
    pages = {f"blocks{r}": NUM_SLOTS * model.geo.pages_per_seq(r) for r in ratios(model.plans)}
    return {"slots": NUM_SLOTS, **pages}


def _step_bucket(tokens: int, seqs: int, outs: int) -> dict[str, int]:
    return {**_cache_sizes(), "tokens": tokens, "seqs": seqs, "outs": outs}


def _draft_bucket(seqs: int) -> dict[str, int]:
    block = _model(True)[0].cfg.text.dspark_block_size
    return {"slots": NUM_SLOTS, "seqs": seqs, "tokens": seqs * block}


def _cases() -> tuple[GraphCase, ...]:
    return (
        # prefill: one sequence's 8-token chunk, logits of its last row; decode: two sequences, one row each
        GraphCase(
            "step",
            lambda: step_graph(_model(False), "v41"),
            {"prefill": _step_bucket(8, 1, 1), "decode": _step_bucket(2, 2, 2)},
        ),
        # verify: two sequences of an anchor and one draft each, logits of every row
        GraphCase(
            "step_dspark", lambda: step_graph(_model(True), "v41_dspark"), {"verify": _step_bucket(4, 2, 4)}
        ),
        GraphCase("draft", lambda: draft_graph(_model(True)), {"draft": _draft_bucket(2)}),
        GraphCase("sample", lambda: _sampler_graphs()[0], {"sample": {"outs": 4}}),
        GraphCase("spec_verify", lambda: _sampler_graphs()[1], {"verify": {"outs": 4, "seqs": 2}}),
    )


GRAPHS: dict[str, GraphCase] = {case.name: case for case in _cases()}


def tiny_graph(name: str) -> Graph:
    """The traced graph `name` of GRAPHS (one of its keys)."""
    if name not in GRAPHS:
        raise KeyError(f"graph {name!r}: expected one of {sorted(GRAPHS)}")
    return GRAPHS[name].make()


def _text(graph: Graph) -> str:
    return format_graph(verify(graph), with_source=False)


def stage_names(case: GraphCase, platforms: tuple[str, ...] = DUMP_PLATFORMS) -> list[str]:
    """The stages `dump_graph` gives for `case`, in order (known without tracing)."""
    per_bucket = [f"{b}.{stage}" for b in case.buckets for stage in ("specialized", *platforms)]
    return ["traced", "cse", "dce", *per_bucket]


def dump_graph(case: GraphCase, platforms: tuple[str, ...] = DUMP_PLATFORMS) -> dict[str, str]:
    """Stage name -> text for one graph: traced, cse, dce, then per bucket specialized and lowered."""
    traced = case.make()
    after_cse = cse(traced)
    optimized = dce(after_cse)  # what graph.passes.optimize gives: the graph the runtime specializes
    out = {"traced": _text(traced), "cse": _text(after_cse), "dce": _text(optimized)}
    for bucket, sizes in case.buckets.items():
        specialized = verify(specialize(optimized, sizes))
        out[f"{bucket}.specialized"] = _text(specialized)
        for platform in platforms:
            out[f"{bucket}.{platform}"] = lower(specialized, platform).as_text()
    return out


def golden_names(platforms: tuple[str, ...] = DUMP_PLATFORMS) -> list[str]:
    """The relative file paths (`graph/stage.txt`) `golden_dumps` gives."""
    return [f"{case.name}/{stage}.txt" for case in GRAPHS.values() for stage in stage_names(case, platforms)]


def golden_dumps(platforms: tuple[str, ...] = DUMP_PLATFORMS) -> dict[str, str]:
    """Relative file path (`graph/stage.txt`) -> text, for every graph of GRAPHS."""
    return {
        f"{case.name}/{stage}.txt": text
        for case in GRAPHS.values()
        for stage, text in dump_graph(case, platforms).items()
    }
