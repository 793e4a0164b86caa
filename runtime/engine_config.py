"""EngineConfig: everything that shapes an engine, built and validated in one place (CLI flags and LLM
keyword arguments map onto it; runtime/engine.py runs it)."""

from __future__ import annotations

from dataclasses import dataclass

from dsgraph.runtime.prefill_truncation import check_truncation_fields
from dsgraph.runtime.spec_setup import check_spec_config


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes an engine, built in one place (CLI flags and LLM kwargs map onto it)."""

    numerics: str = "serving"
    # "cpu": the executable specification; "cuda": weights and caches on the GPU, Triton kernels, one
    # CUDA graph per bucket (platform/cuda), sampling on the device
    platform: str = "cpu"
    max_model_len: int = 1024
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    page_size: int = 16
    cache_budget_bytes: int | None = None  # None: pages for max_num_seqs requests of max_model_len
    # check every weight is finite at load (load_checkpoint names the first NaN/inf tensor); None: only
    # for checkpoints up to checkpoint_io.FINITE_CHECK_BYTES
    check_weights: bool | None = None
    # Prefix caching keeps the global (compressed) caches of earlier prompts and recomputes the last
    # `replay` tokens of a hit to rebuild SWA state, which is never cached (spec 5.6 item 1). "exact"
    # (default) replays window * layers tokens, which gives bit-for-bit the tokens of a cold run at the
    # price of recomputing that many tokens per hit. "window" (an explicit approximation) replays one
    # window: attention reads no SWA key below the replay start (`seq_window_start`), so the replayed rows
    # see truncated windows and the rebuilt SWA state only approximates a cold prefill (global caches stay
    # exact; the error is bounded to the replayed window and deterministic; on the tiny random model the
    # first token's log-probs move by up to ~1.1 nats, tests/e2e/test_llm.py), greedy tokens may change.
    enable_prefix_cache: bool = True
    prefix_replay: str = "exact"
    # "auto": weights from the checkpoint's safetensors; "dummy": random weights of the config's shapes,
    # generated on the platform's device (vLLM's load_format="dummy"; for benchmarks, its text is noise)
    load_format: str = "auto"
    # Speculative decoding (runtime/spec_engine.py) with the checkpoint's own draft layers: "dspark" (V4.1's
    # DSpark stages) or "mtp" (V4's MTP layer, vLLM's method name) drafts and fails naming what is missing
    # when the checkpoint has no such layers; "auto": on when it has them and the platform is cuda (the
    # cpu default stays fast); "off". A method of another family is an error. verify_schedule
    # "confidence" plans each step's verified drafts from the confidence head and the throughput curve;
    # "fixed" verifies draft_len (None: all) drafts per request. deterministic: every emitted token is the
    # target's own seeded sample, so tokens do not depend on the batch or on how many drafts were
    # verified. throughput_curve: (row counts, step ms) given explicitly; None profiles the session at
    # start (cached under $XDG_CACHE_HOME/dsgraph/curves, corrected online from measured step times).
    speculative: str = "auto"
    verify_schedule: str = "confidence"
    draft_len: int | None = None
    deterministic: bool = False
    throughput_curve: tuple[tuple[int, ...], tuple[float, ...]] | None = None
    # draft_pause: skip the draft pass while the realised acceptance does not pay for it, re-probing
    # with exponential backoff (runtime/spec_pause.py; needs a curve, i.e. not in fixed mode without
    # one). draft_cost: (sequence counts, draft pass ms, one time or one per draft depth) given
    # explicitly and used as is; None profiles the draft pass with the curve (when the curve is
    # profiled) and corrects it from measured passes, or takes it as free beside a given
    # throughput_curve. The planner charges it to every plan that verifies drafts.
    draft_pause: bool = True
    draft_cost: tuple[tuple[int, ...], tuple[float, ...]] | None = None
    # Zero-overhead scheduling (runtime/engine_overlap.py): the host commits step N, detokenizes and plans
    # step N+2 while the device runs step N+1. "auto": on for platform cuda (NORMAL and PROMPT engines),
    # off on cpu; "on" / "off". COMPLETION engines and steps with prompt logprobs or teacher-forced tokens
    # run without overlap.
    overlap: str = "auto"
    # Prefill/decode disaggregation (runtime/kvstore/pd_engines.py): "normal" prefills and decodes;
    # "prompt" prefills, hands the caches off and stops at the first token; "completion" admits handed-off
    # requests and decodes. Overlap and DSpark drafting run on normal engines only.
    engine_type: str = "normal"
    # Prefill truncation (decoder-side SWA bounded replay; runtime/prefill_truncation.py): "off" (default,
    # exact), or "mask" / "compact", an explicit approximation: the decoder layers run only on each
    # prompt's last prefill_keep_tokens tokens (None: the minimum, sliding_window + maximum backtrack =
    # 134 for V4.1), so their window state only approximates a full prefill; global caches stay exact.
    # compact gathers the kept rows (the speed-up), mask narrows attention (same values, a reference).
    # Requests with prompt logprobs or golden_token_ids run untruncated. Off by default, like the
    # reference numerics and DeepInfer's own setting; vLLM turns its replay on by default (README).
    prefill_truncation: str = "off"
    prefill_keep_tokens: int | None = None
    # An ahead-of-time bundle (`dsgraph compile`, docs/bundle.md): graphs, bucket programs, kernels and
    # tuned tables come from it instead of tracing, lowering, compiling and profiling; a bundle that does
    # not fit this machine or these options is refused with every mismatch listed. None: build at start.
    bundle: str | None = None

    def __post_init__(self) -> None:
        check_spec_config(self)
        check_truncation_fields(self.prefill_truncation, self.prefill_keep_tokens)
        if self.engine_type not in ("normal", "prompt", "completion"):
            raise ValueError(
                f"engine_type: {self.engine_type!r}, expected 'normal', 'prompt' or 'completion'"
            )
        # a PROMPT engine overlaps only when asked ("auto" stays off there: whether it pays is measured
        # by `dsgraph bench pd-overlap`); a COMPLETION engine never does
        no_overlap = self.engine_type == "completion" and self.overlap == "on"
        if self.engine_type != "normal" and (no_overlap or self.speculative not in ("auto", "off")):
            raise ValueError(
                f"engine_type: {self.engine_type!r} runs without drafting (completion: without overlap); "
                f"got overlap={self.overlap!r}, speculative={self.speculative!r}"
            )
        if self.overlap not in ("auto", "on", "off"):
            raise ValueError(f"overlap: {self.overlap!r}, expected 'auto', 'on' or 'off'")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format: {self.load_format!r}, expected 'auto' or 'dummy'")
        if self.prefix_replay not in ("window", "exact"):
            raise ValueError(f"prefix_replay: {self.prefix_replay!r}, expected 'window' or 'exact'")
        if self.platform not in ("cpu", "cuda"):
            raise ValueError(f"platform: {self.platform!r}, expected 'cpu' or 'cuda'")
        if self.numerics not in ("serving", "reference"):
            raise ValueError(f"numerics: {self.numerics!r}, expected 'serving' or 'reference'")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r}, expected an integer >= 1")
