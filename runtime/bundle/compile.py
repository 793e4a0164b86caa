"""`dsgraph compile`: build an engine cold, lower (and on cuda warm: run and capture) every bucket its
configuration can run, and write the bundle (docs/bundle.md): graphs per (step kind, bucket), the programs'
texts and memory plans, the symbolic and sampler graphs, Triton's kernel cache (cuda), the tuned tables,
the expert placement (EP) and the manifest with a checksum per file.

Kernels are cached where Triton is pointed before the engine starts, so compile in a fresh process (the
CLI does): kernels this process compiled earlier live in its memory and would not be written again."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsgraph.platform import env
from dsgraph.runtime.bundle import store
from dsgraph.runtime.bundle.buckets import BucketSpec, enumerate_buckets, parse_bucket_name
from dsgraph.runtime.bundle.kernels import kernel_summary
from dsgraph.runtime.bundle.manifest import (
    COMPILED_FIELDS,
    FORMAT,
    VERSION,
    config_hash,
    current_environment,
    write_manifest,
)
from dsgraph.runtime.bundle.warm import warm_inputs, warm_truncated_inputs
from dsgraph.runtime.spec_draft import bundle_kind

__all__ = ["compile_bundle"]


def _engine(model_dir: Path, config: Any, ep: int, extra_experts: int | None) -> tuple[Any, Any]:
    """The cold engine (it traces, and profiles the tuned tables) and its EP rank (None without EP)."""
    from dsgraph.runtime.engine import Engine

    if ep == 1:
        return Engine(model_dir, config), None
    from dsgraph.runtime.distributed.config import EPConfig
    from dsgraph.runtime.distributed.rank import RankSetup

    if config.platform == "cuda":
        raise ValueError(
            f"--ep {ep} with --platform cuda: warming kernels needs the {ep} ranks; not yet supported"
        )
    rank = RankSetup(
        0, EPConfig(ep=ep) if extra_experts is None else EPConfig(ep=ep, extra_experts=extra_experts)
    )
    return Engine(model_dir, config, rank=rank), rank


def _warm_step(engine: Any, kind: str, dims: dict[str, int]) -> dict[str, Any] | None:
    """The step that fills the bucket (None: a truncated bucket no step can reach, never run)."""
    model = engine.session.model
    seqs = min(dims["seqs"], engine.session.cache_sizes.num_slots)
    if kind == "step":
        return warm_inputs(model, dims["tokens"], seqs, dims["outs"])
    mode = engine.config.truncation.mode
    return warm_truncated_inputs(model, dims["tokens"], seqs, dims["outs"], dims.get("kept", 0), mode)


def _step_program(engine: Any, kind: str, dims: dict[str, int], warm: bool) -> Any:
    session = engine.session
    sizes = {**session.cache_sizes.sizes(), **dims}
    step = _warm_step(engine, kind, dims) if warm else None
    if step is not None:
        session.run(step)
    return session._program(sizes, kind == "truncated")


def _draft_program(engine: Any, seqs: int, warm: bool, greedy: bool) -> Any:
    drafter, slots = engine.spec.drafter, engine.session.cache_sizes.num_slots
    if warm:
        drafter.run(drafter.probe_requests(min(seqs, slots), greedy))
    return drafter._program(seqs, greedy)


def _write_bucket(root: Path, kind: str, name: str, program: Any) -> dict[str, Any]:
    size = store.write_graph(root, store.graph_path(kind, name), program.graph)
    store.write_text(root, store.text_path(kind, name), program.as_text())
    plan = program.memory  # None when a dim stays symbolic (an EP group's received rows per MoE)
    return {
        "graph_bytes": size,
        "arena_bytes": None if plan is None else plan.arena_bytes,
        "peak_bytes": None if plan is None else plan.peak_bytes,
    }


def _buckets(root: Path, engine: Any, spec: BucketSpec, warm: bool, log: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for kind, names in enumerate_buckets(spec).items():
        out[kind] = {}
        for i, name in enumerate(names):
            dims = parse_bucket_name(name)
            if kind in ("draft", "draft_greedy"):
                program = _draft_program(engine, dims["seqs"], warm, kind == "draft_greedy")
            else:
                program = _step_program(engine, kind, dims, warm)
            out[kind][name] = _write_bucket(root, kind, name, program)
            log(f"  {kind} {name} ({i + 1}/{len(names)})")
    for t in engine.session.caches.values():  # warm-up steps wrote them
        t.zero_()
    return out


def _graphs(root: Path, engine: Any, kinds: set[str]) -> list[str]:
    session = engine.session
    store.write_graph(root, store.symbolic_path("step"), session.graph)
    if "truncated" in kinds:
        store.write_graph(root, store.symbolic_path("truncated"), session._graph(True))
    for greedy in (False, True):
        if bundle_kind(greedy) in kinds:
            graph = engine.spec.drafter._graph(greedy)
            store.write_graph(root, store.symbolic_path(bundle_kind(greedy)), graph)
    named = engine.sampler.graphs  # every graph of GRAPHS, so that a bundle start traces none
    for name, graph in named.items():
        store.write_graph(root, store.symbolic_path(f"sampler/{name}"), graph)
    return list(named)


def _tables(engine: Any) -> dict[str, Any]:
    spec = engine.spec
    if spec is None:
        return {}
    out: dict[str, Any] = {}
    curve = spec.scheduler.curve
    if curve is not None:
        out["throughput_curve"] = [list(curve.sizes), list(curve.step_ms)]
    full, greedy = spec.cost.full, spec.cost.greedy
    if full.ms:  # the greedy variant's table only beside the full graph's (the config's rule)
        out["draft_cost"] = _cost_table(full.ms)
        if greedy is not None and greedy.ms:
            out["draft_cost_greedy"] = _cost_table(greedy.ms)
    return out


def _cost_table(ms: dict[int, float]) -> list[list[Any]]:
    seqs = sorted(ms)
    return [seqs, [ms[s] for s in seqs]]


def _placement(root: Path, rank: Any) -> None:
    """The initial expert placement of every MoE (what each rank's slots hold) of an EP bundle."""
    if rank is None:
        return
    moes = {
        m: {"num_logical": p.num_logical, "phys_to_logical": list(p.phys_to_logical)}
        for m, p in rank.placements.items()
    }
    store.write_json(root, store.PLACEMENT, {"ep": rank.config.ep, "moes": moes})


def _prepare_out(out: Path) -> Path:
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out}: exists and is not empty; remove it or choose another folder")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def compile_bundle(
    model_dir: Path | None,
    config: Any,
    out: Path,
    *,
    ep: int = 1,
    extra_experts: int | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Compile the bundle of `config` for the checkpoint at `model_dir` (None: the embedded tiny model)
    into the new folder `out`; returns the manifest."""
    from dsgraph.tools.generate_cmd import default_model_dir

    log = log or (lambda msg: print(msg, file=sys.stderr))
    root = default_model_dir() if model_dir is None else Path(model_dir)
    tmp = _prepare_out(Path(out))
    cuda = config.platform == "cuda"
    if cuda:  # before the engine starts: every kernel it compiles lands in the bundle
        env.set_triton_cache_dir(tmp / store.KERNELS)
    config = replace(config, bundle=None)
    engine, rank = _engine(root, config, ep, extra_experts)
    limits = config.scheduler
    spec = BucketSpec(
        limits.max_num_batched_tokens, limits.max_num_seqs, config.truncation.mode, engine.spec is not None
    )
    log(f"dsgraph compile: {root} on {config.platform} into {out}")
    buckets = _buckets(tmp, engine, spec, cuda, log)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "environment": current_environment(config.platform),
        "model_dir": None if model_dir is None else str(root.resolve()),
        "config_hash": config_hash(root),
        "engine": {k: config.flat()[k] for k in COMPILED_FIELDS},
        "load_format": config.load.format,  # not checked: Session.load's default only
        "ep": ep,
        "cache_sizes": engine.session.cache_sizes.sizes(),
        "buckets": buckets,
        "sampler_graphs": _graphs(tmp, engine, set(buckets)),
        "tables": _tables(engine),
        "kernels": kernel_summary(
            tmp / store.KERNELS, config.platform, sorted(k for k in buckets if k != "truncated")
        ),
    }
    _placement(tmp, rank)
    store.write_json(tmp, store.CAPTURE, engine.session.runner.capture_facts())
    written = write_manifest(tmp, manifest)
    shutil.rmtree(out, ignore_errors=True)  # an empty folder (_prepare_out refused any other)
    tmp.rename(out)
    return written
