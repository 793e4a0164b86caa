"""Opening a bundle: checked against this machine and run (every mismatch at once), its graphs read
instead of traced, its programs rebuilt by binding each equation to the platform's rule (the stored
graphs are already specialized and ordered for in-place writes, so nothing is lowered again), Triton's
cache pointed at its kernels. `Session` and `Engine` take the opened `Bundle`."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsgraph.graph import Graph
from dsgraph.platform import env
from dsgraph.platform.registry import LoweredStep, Platform, Program, get_platform
from dsgraph.runtime.bundle import checks, store
from dsgraph.runtime.bundle.buckets import STEP_DIM_ORDER, BucketSpec, bucket_name, enumerate_buckets
from dsgraph.runtime.bundle.kernels import repoint_groups
from dsgraph.runtime.bundle.manifest import COMPILED_FIELDS, config_hash, current_environment, read_manifest

__all__ = ["Bundle", "bind_program", "open_bundle"]


def bind_program(graph: Graph, platform: Platform | str) -> Program:
    """The program of an already lowered graph: each equation bound to the platform's rule."""
    plat = get_platform(platform) if isinstance(platform, str) else platform
    where = f"graph {graph.name}, "
    steps = tuple(LoweredStep(e, plat.rule_for(e, f"{where}eqn {i} ")) for i, e in enumerate(graph.eqns))
    return Program(graph, plat.name, steps, plat.fallbacks, plat.inplace, plat.kernels, plat)


@dataclass
class Bundle:
    root: Path
    manifest: dict[str, Any]
    programs_loaded: int = 0  # bucket programs read from the bundle so far
    kernel_dir: Path | None = None  # where Triton's cache points (a copy of the bundle's kernels)
    _graphs: dict[str, Graph] = field(default_factory=dict)

    @property
    def drafting(self) -> bool:
        return "draft" in self.manifest["buckets"]

    def has_kind(self, kind: str) -> bool:
        """Whether the bundle holds programs of a step kind (buckets.KINDS)."""
        return kind in self.manifest["buckets"]

    def engine_config(self, **overrides: Any) -> Any:
        """The EngineConfig the bundle was compiled for (its compiled fields), with `overrides`."""
        from dsgraph.runtime.engine_config import EngineConfig

        fields = {k: self.manifest["engine"][k] for k in COMPILED_FIELDS}
        fields["load_format"] = self.manifest.get("load_format", "auto")
        return EngineConfig.from_flat(**{**fields, "bundle": str(self.root), **overrides})

    def model_dir(self) -> Path:
        """The checkpoint the bundle was compiled from (the embedded tiny model when it was that)."""
        if self.manifest.get("model_dir") is None:
            from dsgraph.tools.generate_cmd import default_model_dir

            return default_model_dir()
        return Path(self.manifest["model_dir"])

    def check(self, config: Any, model_dir: Path, ep: int = 1) -> None:
        """BundleMismatchError listing every way the bundle does not fit this machine and run."""
        m = self.manifest
        problems = checks.check_environment(m, current_environment(config.platform))
        problems += checks.check_files(self.root, m)
        flat = config.flat()
        fields = {k: flat[k] for k in COMPILED_FIELDS}
        problems += checks.check_run(m, fields, config_hash(model_dir), ep)
        if not problems:  # with every field equal the bucket list the run needs is the compiled one
            limits = config.scheduler
            spec = BucketSpec(
                limits.max_num_batched_tokens, limits.max_num_seqs, config.truncation.mode, self.drafting
            )
            needed = enumerate_buckets(spec)
            problems += checks.check_buckets(m, needed)
        checks.raise_if(self.root, problems)

    def check_drafting(self, enabled: bool) -> None:
        if enabled != self.drafting:
            have = "with" if self.drafting else "without"
            want = "drafts" if enabled else "does not draft"
            checks.raise_if(
                self.root,
                [
                    f"speculative: the bundle was compiled {have} DSpark drafting, this run {want}; "
                    f"pass --speculative {'dspark' if self.drafting else 'off'}, or {checks.RECOMPILE}"
                ],
            )

    def graph(self, kind: str) -> Graph:
        """The symbolic graph of a step kind ("step", "truncated", "draft", "draft_greedy") or a sampler
        graph."""
        if kind not in self._graphs:
            self._graphs[kind] = store.read_graph(self.root, store.symbolic_path(kind))
        return self._graphs[kind]

    def target_graph(self, weight_types: Mapping[str, Any]) -> Graph:
        """The target step's graph; the session's weights must have the types it was traced with."""
        graph = self.graph("step")
        pairs = zip(graph.inputs, graph.input_names, strict=True)
        traced = {n.removeprefix("weights."): v.type for v, n in pairs if n.startswith("weights.")}
        problems = [
            f"weight {name}: the bundle's graph reads {traced.get(name)}, this checkpoint has "
            f"{weight_types.get(name)}; {checks.RECOMPILE}"
            for name in sorted(set(traced) | set(weight_types))
            if str(traced.get(name)) != str(weight_types.get(name))
        ]
        checks.raise_if(
            self.root, problems[:8] + ([f"and {len(problems) - 8} more weights"] if len(problems) > 8 else [])
        )
        return graph

    def step_program(self, sizes: Mapping[str, int], truncated: bool, platform: Platform | str) -> Program:
        """The target step's program of a bucket (`sizes`: the session's cache and step dims)."""
        cache = {k: v for k, v in sizes.items() if k not in STEP_DIM_ORDER}
        if cache != self.manifest["cache_sizes"]:
            checks.raise_if(
                self.root,
                [
                    f"cache sizes: the bundle's programs are specialized to {self.manifest['cache_sizes']}, "
                    f"this session has {cache}; {checks.RECOMPILE}"
                ],
            )
        dims = {k: v for k, v in sizes.items() if k in STEP_DIM_ORDER}
        return self.program("truncated" if truncated else "step", bucket_name(dims), platform)

    def program(self, kind: str, bucket: str, platform: Platform | str) -> Program:
        """The bucket's program; a bucket the bundle does not hold is refused (never lowered here)."""
        if bucket not in self.manifest["buckets"].get(kind, {}):
            checks.raise_if(
                self.root,
                [
                    f"buckets: the bundle has no {kind} bucket {bucket} (a step beyond the compiled limits "
                    f"max_num_batched_tokens / max_num_seqs); {checks.RECOMPILE}"
                ],
            )
        self.programs_loaded += 1
        return bind_program(store.read_graph(self.root, store.graph_path(kind, bucket)), platform)

    def capture_facts(self) -> dict[str, Any]:
        """What the compile's captures learnt (runner.capture_facts), {} for a bundle without them."""
        path = self.root / store.CAPTURE
        return store.read_json(self.root, store.CAPTURE) if path.is_file() else {}

    def sampler_graphs(self) -> dict[str, Graph]:
        return {name: self.graph(f"sampler/{name}") for name in self.manifest["sampler_graphs"]}

    def with_tables(self, config: Any) -> Any:
        """`config` with the bundle's tuned tables where it gives none (they are not profiled again)."""
        tables = self.manifest.get("tables", {})
        spec = config.speculative
        curve = spec.throughput_curve or _pair(tables.get("throughput_curve"))
        if spec.draft_cost is not None:  # the caller's draft costs, as given
            return replace(config, speculative=replace(spec, throughput_curve=curve))
        costs = {name: _pair(tables.get(name)) for name in ("draft_cost", "draft_cost_greedy")}
        return replace(config, speculative=replace(spec, throughput_curve=curve, **costs))

    def point_kernels(self) -> Path | None:
        """Triton's cache at a copy of the bundle's kernels (the copy takes Triton's writes; the bundle
        stays as checksummed). None on cpu, where there are no kernels."""
        if not self.manifest.get("kernels", {}).get("files"):
            return None
        dest = env.cache_home() / "dsgraph" / "bundle-kernels" / self.manifest["manifest_sha256"][:16]
        shutil.copytree(self.root / store.KERNELS, dest, dirs_exist_ok=True)
        repoint_groups(dest)  # Triton reads a kernel only at the paths its group file names
        env.set_triton_cache_dir(dest)
        self.kernel_dir = dest
        return dest


def _pair(table: Any) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    if not table:
        return None
    return tuple(int(s) for s in table[0]), tuple(float(t) for t in table[1])


def open_bundle(path: str | Path) -> Bundle:
    root = Path(path)
    return Bundle(root, read_manifest(root))
