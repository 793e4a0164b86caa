"""A Session owns one rank's weights, cache memory and lowered step programs; `run(step)` executes one
step. The public face (docs/session.md): `Session.from_checkpoint(dir, config)`, `open_sequence()`,
`new_step().add(seq, ids).build()` (runtime/step_builder.py) and `run(step)` -> logits.

Programs are lowered once per bucket (the concrete sizes of the step's symbolic dims) and reused:
`programs_built` counts lowerings, so a repeated bucket never re-lowers.

Execution belongs to the platform: the session hands each step to its platform's bucketed runner
(`platform.registry.make_runner`: platform/cpu/runner.py, platform/cuda/runner.py), with the bucket's key,
how to lower its program, the persistent inputs (weights, caches) and the step's inputs padded to the
bucket (`runner.bucket`: the cpu runner runs a step at its own sizes, the cuda runner pads every step dim
(tokens, seqs, outs) to a power of two (`runtime/step_padding.py`), so at most
log2(max tokens) * log2(max seqs) * log2(max outs) buckets exist). On the cuda platform weights and caches
live on the device, cache writes are in place, and each bucket's program is captured into CUDA graphs
once (`captures` counts them) and replayed, or with `cuda.capture` False run eagerly on the same padded
shapes (debugging). Buckets of more than `cuda.capture_max_tokens` tokens (long prefill chunks) always run
eagerly (`EngineConfig.cuda`, runtime/engine_config.py, says why).

A truncated prefill step (it carries `seq_decoder_window_start`; runtime/prefill_truncation.py) runs the
model's truncated graph variant, lowered and captured per bucket like the plain one but keyed apart; in
compact its `kept` dim (the decoder's rows) is one more bucketed dim.

A session of an ahead-of-time bundle (`Session.load`, `bundle=`; runtime/bundle/, docs/bundle.md) reads
its graphs and bucket programs from the bundle instead of tracing and lowering them, and pads every step to
the bundle's buckets on cpu too (padding rows read and write nothing, so the logits are unchanged).

Overlapped scheduling: `run(step, fix)` first copies into the step's `token_ids` / `lookback` the tokens
the previous step sampled on the device (`runtime/input_fix.py`); the source rows travel with the step's
inputs as staged extras (on cuda the same one host-to-device copy) and the correction runs between staging
and launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsgraph.graph import Graph
from dsgraph.graph.passes import optimize, specialize
from dsgraph.graph.types import TensorType
from dsgraph.models.interface import Model as V41Model
from dsgraph.models.interface import ratios
from dsgraph.platform.registry import (
    BucketRunner,
    Platform,
    Program,
    lower,
    make_runner,
    place_weights,
    platform_name,
    resolve_device,
    torch_dtype,
)
from dsgraph.runtime.engine_config import CudaConfig, EngineConfig
from dsgraph.runtime.input_fix import FIXED_INPUTS, InputFix, fix_inputs, padded_sources
from dsgraph.runtime.replay import replay_table
from dsgraph.runtime.step_builder import CachePool, SeqState, Step, StepBuilder
from dsgraph.runtime.step_padding import bucket_size, pad_step

Array = torch.Tensor | np.ndarray


class CacheBudgetError(ValueError):
    """The cache budget cannot hold what the configuration asks for."""


@dataclass(frozen=True)
class CacheSizes:
    num_slots: int  # request state slots (SWA rings + compressor state)
    num_pages: dict[int, int]  # ratio -> pages of the compressed caches

    def sizes(self) -> dict[str, int]:
        return {"slots": self.num_slots, **{f"blocks{r}": n for r, n in self.num_pages.items()}}


def _bytes_per(model: V41Model, dim: str) -> int:
    """Bytes of all caches per unit of one symbolic cache dim (a slot, or a page of one ratio)."""
    total = 0
    for t in model.cache_types().values():
        if dim in t.shape:
            rest = TensorType(tuple(1 if d == dim else d for d in t.shape), t.dtype)
            total += rest.nbytes()
    return total


def size_caches(model: V41Model, num_slots: int, budget_bytes: int) -> CacheSizes:
    """Split a byte budget: `num_slots` state slots, the rest into pages; every ratio covers equal tokens."""
    rs = ratios(model.plans)
    slot_bytes = num_slots * _bytes_per(model, "slots")
    # one "unit" = enough pages of every ratio for page_size * lcm(ratios) tokens
    span = model.geo.page_size * int(np.lcm.reduce(rs)) if rs else 1
    unit_pages = {r: span // (model.geo.page_size * r) for r in rs}
    unit_bytes = sum(n * _bytes_per(model, f"blocks{r}") for r, n in unit_pages.items())
    units = (budget_bytes - slot_bytes) // unit_bytes if unit_bytes else 0
    if rs and units * span < model.geo.max_model_len:
        need = -(-model.geo.max_model_len // span) * unit_bytes + slot_bytes
        raise CacheBudgetError(
            f"cache budget {budget_bytes} B: {slot_bytes} B for {num_slots} state slots leaves room for "
            f"{max(units, 0) * span} tokens of compressed cache; one request of max_model_len "
            f"{model.geo.max_model_len} needs {need} B"
        )
    return CacheSizes(num_slots, {r: int(units * n) for r, n in unit_pages.items()})


# Symbolic step dims, each bucketed on cuda: rows, sequences, sampled rows, and the decoder rows of a
# compact truncated prefill (models/deepseek_v41/truncation.py).
STEP_DIMS = ("tokens", "seqs", "outs", "kept")
# A step carrying this input is a truncated prefill: it runs the model's truncated graph variant, whose
# programs and captures are keyed apart (TRUNCATED_KEY) from the plain graph's.
TRUNCATED_INPUT = "seq_decoder_window_start"
TRUNCATED_KEY = "~truncated"


class Session:
    def __init__(
        self,
        model: V41Model,
        weights: Mapping[str, torch.Tensor],
        caches: CacheSizes,
        *,
        debug: bool = False,
        platform: str | Platform = "cpu",
        device: torch.device | str | None = None,
        cuda: CudaConfig | None = None,
        bundle: Any = None,
    ) -> None:
        """`cuda`: capture, its token limit, host-resident Engram tables and the side stream on the cuda
        platform (EngineConfig.cuda; default CudaConfig())."""
        from dsgraph.models.interface import weight_types
        from dsgraph.runtime.spec_draft import target_weights

        self.cuda = CudaConfig() if cuda is None else cuda
        self.model, self.platform, self.capture = model, platform, self.cuda.capture
        self.capture_max_tokens = self.cuda.capture_max_tokens
        # the platform's bucketed runner executes every step (platform/<name>/runner.py)
        name = platform_name(platform)
        self.runner: BucketRunner = make_runner(
            platform,
            resolve_device(name if device is None else device),
            replay_table(),
            side_stream=self.cuda.side_stream,
        )
        self.device = self.runner.device
        # A model built with dspark=True also writes the DSpark context: its step reads the context weights.
        target = target_weights(model, weights)
        # On a CUDA device Engram tables of >= engram_host_min_bytes (None: DSGRAPH_ENGRAM_HOST_MIN_BYTES)
        # stay in pinned host memory (read over PCIe)
        placed = place_weights(target, self.device, self.cuda.engram_host_min_bytes)
        self.weights = {f"weights.{k}": v for k, v in placed.items()}
        self._weight_types = weight_types(target, backbone_only=False)
        self._debug = debug
        # a bundle's session reads its graphs and bucket programs from the bundle (runtime/bundle/) and
        # pads every step to the bundle's buckets, on cpu too
        self.bundle = bundle
        if bundle is not None:
            self.graph: Graph = bundle.target_graph(self._weight_types)
            self.runner.adopt_capture_facts(bundle.capture_facts())
        else:
            self.graph = optimize(model.trace_step(self._weight_types, debug=debug))
        self.graphs: dict[bool, Graph] = {False: self.graph}  # truncated prefill -> its graph variant
        self.cache_sizes = caches
        self.caches = {
            name: torch.zeros(
                [caches.sizes().get(d, d) for d in t.shape], dtype=torch_dtype(t.dtype), device=self.device
            )
            for name, t in model.cache_types().items()
        }
        self.programs: dict[tuple[tuple[str, int], ...], Program] = {}
        self.programs_built = 0
        all_inputs = model.step_types(truncated=model.truncation != "off")
        self.step_dims = {name: str(t.shape[0]) for name, t in all_inputs.items()}
        self.last_debug: dict[str, torch.Tensor] = {}
        self.tokenizer: Any = None  # the checkpoint's tokenizer (set by from_checkpoint)
        self._seqs: CachePool | None = None

    @classmethod
    def from_checkpoint(
        cls, model_dir: str | Path | None = None, config: EngineConfig | None = None
    ) -> Session:
        """A session over the checkpoint in `model_dir` (config.json, tokenizer.json, safetensors; None:
        the embedded tiny random checkpoint, as `LLM()`) with the options of `config` that shape one
        (platform, numerics, max_model_len, scheduler.max_num_seqs, cache.page_size, cache.budget_bytes,
        load, cuda); its `tokenizer` is the checkpoint's. Drafting, scheduling and serving options are the
        engine's and do not apply here."""
        from dsgraph.runtime.checkpoint_load import build_target, cache_sizes, load_model_dir

        if model_dir is None:
            from dsgraph.tools.generate_cmd import default_model_dir

            model_dir = default_model_dir()
        config = EngineConfig() if config is None else config
        resolve_device(config.platform)  # an absent device fails here, before any weight is read
        loaded = load_model_dir(Path(model_dir), config)
        model = build_target(loaded, config)
        session = cls(
            model, loaded.weights, cache_sizes(model, config), platform=config.platform, cuda=config.cuda
        )
        session.tokenizer = loaded.tokenizer
        return session

    @classmethod
    def load(
        cls, bundle: str | Path, model_dir: str | Path | None = None, config: EngineConfig | None = None
    ) -> Session:
        """A session from an ahead-of-time bundle (`dsgraph compile`, docs/bundle.md): its graphs and
        bucket programs are read, not traced or lowered, and Triton's cache points at its kernels; then
        the weights load. `model_dir` defaults to the checkpoint it was compiled from, `config` to its
        compiled options. A bundle that does not fit raises BundleMismatchError listing every mismatch."""
        from dsgraph.runtime.bundle.session_load import load_session

        return load_session(cls, bundle, model_dir, config)

    def open_sequence(self) -> SeqState:
        """A new sequence with a state slot of its own (`CachePoolError` when every slot is held)."""
        if self._seqs is None:
            self._seqs = CachePool(self.model, self.cache_sizes.num_slots, self.cache_sizes.num_pages)
        return self._seqs.open()

    def close_sequence(self, seq: SeqState) -> None:
        """Hand back the sequence's slot and pages."""
        if self._seqs is None:
            raise ValueError("close_sequence: this session opened no sequence")
        self._seqs.close(seq)

    def new_step(self) -> StepBuilder:
        """A builder of the next step over sequences of `open_sequence` (runtime/step_builder.py)."""
        if self._seqs is None:
            raise ValueError("new_step: open a sequence first (Session.open_sequence)")
        return StepBuilder(self.model, self._seqs)

    def _sizes(self, step: Mapping[str, Array]) -> dict[str, int]:
        sizes = dict(self.cache_sizes.sizes())
        for name, value in step.items():
            dim = self.step_dims.get(name)
            if dim in STEP_DIMS:
                sizes[dim] = int(value.shape[0])
        return sizes

    def _graph(self, truncated: bool) -> Graph:
        if truncated not in self.graphs and self.bundle is not None:
            self.graphs[truncated] = self.bundle.graph("truncated")
        if truncated not in self.graphs:
            self.graphs[truncated] = optimize(
                self.model.trace_step(self._weight_types, debug=self._debug, truncated=True)
            )
        return self.graphs[truncated]

    def _key(self, sizes: Mapping[str, int], truncated: bool) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(sizes.items())) + (((TRUNCATED_KEY, 1),) if truncated else ())

    def _program(self, sizes: dict[str, int], truncated: bool = False) -> Program:
        key = self._key(sizes, truncated)
        if key not in self.programs and self.bundle is not None:
            self.programs[key] = self.bundle.step_program(sizes, truncated, self.platform)
        if key not in self.programs:
            self.programs[key] = lower(specialize(self._graph(truncated), sizes), self.platform)
            self.programs_built += 1
        return self.programs[key]

    def run(self, step: Mapping[str, Array] | Step, fix: InputFix | None = None) -> torch.Tensor:
        """Execute one step (a built `Step`, or inputs of `V41Model.step_types()` by name); returns logits
        [outs, vocab] (on cuda a view of the bucket's static buffer, valid until the next step). A `Step`'s
        sequences then hold its tokens. `fix`: tokens to take from the previous step's device samples
        before the step runs (overlapped scheduling)."""
        if isinstance(step, Step):
            logits = self.run(step.inputs, fix)
            step.commit()
            return logits
        key, sizes, padded, outs = self._bucket(step)
        truncated = TRUNCATED_INPUT in step
        inputs: dict[str, Any] = {f"step.{k}": v for k, v in padded.items()}
        sources = padded_sources(fix, {k: padded[k].shape for k in FIXED_INPUTS})
        inputs.update({f"fix.{k}": v for k, v in sources.items()})
        extra = {f"fix.{k}": (tuple(v.shape), torch.int32) for k, v in sources.items()}

        def before(t: dict[str, torch.Tensor]) -> None:  # the previous step's samples, on the device
            assert fix is not None
            fixed = {k: t[f"step.{k}"] for k in sources}
            fix_inputs(fixed, {k: t[f"fix.{k}"] for k in sources}, fix.prev_tokens)

        out = self.runner.run(
            key,
            lambda: self._program(sizes, truncated),
            self._fixed(),
            inputs,
            capture=self.capture and sizes["tokens"] <= self.capture_max_tokens,
            padding=lambda: self._padding(padded, key, extra),
            extra=extra,
            before=None if fix is None else before,
        )
        self.runner.keep_caches(self.caches, out)
        self.last_debug = {k.removeprefix("debug."): v for k, v in out.items() if k.startswith("debug.")}
        return out["logits"][:outs]

    def _bucket(self, step: Mapping[str, Array]) -> tuple[Any, dict[str, int], dict[str, np.ndarray], int]:
        """(the bucket's key, its sizes, the step's inputs padded to it, the real number of outputs)."""
        sizes = self._sizes(step)
        outs = sizes["outs"]
        # a bundle's session pads to the bundle's power-of-two buckets on every platform
        pad = bucket_size if self.bundle is not None else self.runner.bucket
        sizes.update({d: pad(sizes[d]) for d in STEP_DIMS if d in sizes})
        padded = pad_step({k: np.asarray(v) for k, v in step.items()}, self.step_dims, sizes)
        return self._key(sizes, TRUNCATED_INPUT in step), sizes, padded, outs

    def bound_program(self, step: Mapping[str, Array]) -> tuple[Any, dict[str, torch.Tensor]]:
        """The step's bucket program bound to the device (the runner's) and its eager inputs by name, for
        tools that run it equation by equation (the op profile)."""
        key, sizes, padded, _ = self._bucket(step)
        program = self.runner.program(key, lambda: self._program(sizes, TRUNCATED_INPUT in step))
        tensors = {f"step.{k}": torch.from_numpy(np.array(v)).to(self.device) for k, v in padded.items()}
        return program, {**self._fixed(), **tensors}

    def _fixed(self) -> dict[str, torch.Tensor]:
        return {**self.weights, **{f"caches.{k}": v for k, v in self.caches.items()}}

    def _padding(
        self,
        padded: Mapping[str, np.ndarray],
        key: tuple[tuple[str, int], ...],
        extra: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    ) -> dict[str, np.ndarray]:
        """An all-padding step of the bucket `key` (what a capture records: it writes no cache entry)."""
        empty = {k: np.zeros((0, *v.shape[1:]), v.dtype) for k, v in padded.items()}
        padding = {f"step.{k}": v for k, v in pad_step(empty, self.step_dims, dict(key)).items()}
        padding.update({k: np.full(shape, -1, np.int32) for k, (shape, _) in extra.items()})
        return padding

    @property
    def captured(self) -> dict[Any, Any]:
        """Bucket -> its capture (the runner's; empty on a platform that captures nothing)."""
        return self.runner.captured

    @property
    def captures(self) -> int:
        return self.runner.captures
