"""The decode step of the whole engine loop, as vLLM's peer benchmark measures its own: `Engine.step()`
wall time (plan, model step, sampling, commit, detokenization, events: the host's work included, not a
captured replay alone) once every request of a batch is past prefill, plus a cross-check by differencing
two `LLM.generate` calls of 1 and 1 + K tokens. The model is built from a config alone with random weights
(load_format "dummy": no checkpoint on disk): the 8-layer full-width bench configuration
(tools/bench/model_config.py) or, for a quick run on cpu, the tiny one. Prefix caching is off, like the
peer's; drafting is off unless asked (`speculative`), so both sides emit one token per request a step.
`tools/bench/engine_cmd.py` is its command, `dsgraph bench engine`."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsgraph.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine is imported where a run starts: `dsgraph bench --help` stays light
    from dsgraph.runtime.engine import Engine, TokenEvent
    from dsgraph.runtime.llm import LLM

MODELS = ("bench", "tiny")
# Request ids of the engine loop, clear of those `LLM.generate` hands out (counting from 0) in the same
# engine for the differencing check.
LOOP_RID_BASE = 1 << 40
# Context beyond the tokens a run asks for: prefill may end a step late for some requests, and with overlap
# the engine plans one step ahead of the tokens it has returned.
SLACK_TOKENS = 8


@dataclass(frozen=True)
class EnginePlan:
    """What one run measures; the fields of the peer's arguments carry the same names."""

    batches: tuple[int, ...] = (1, 64)
    prompt_len: int = 1024
    warmup_steps: int = 8
    steps: int = 64  # timed steps of the engine loop
    diff_k: int = 64  # extra tokens of the longer generate() call
    profile_steps: int = 0  # steps profiled after the timed ones (tools/bench/engine_profile.py); 0: none

    def __post_init__(self) -> None:
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"batches: {self.batches!r}, expected integers >= 1")
        for name, least in (
            ("prompt_len", 1),
            ("warmup_steps", 0),
            ("steps", 1),
            ("diff_k", 1),
            ("profile_steps", 0),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: {value!r}, expected an integer >= {least}")


def config_dir(model: str, root: Path) -> Path:
    """A folder holding only config.json and tokenizer.json of `model` (weights are generated)."""
    root.mkdir(parents=True, exist_ok=True)
    if model == "bench":
        from dsgraph.models.deepseek_v41.tokenizer_fixture import deepseek_tokenizer_path
        from dsgraph.tools.bench.model_config import bench_config_dict

        (root / "config.json").write_text(json.dumps(bench_config_dict(), indent=2))
        shutil.copyfile(deepseek_tokenizer_path(), root / "tokenizer.json")  # the released vocabulary
    elif model == "tiny":
        from dsgraph.tools.generate_cmd import default_model_dir

        for name in ("config.json", "tokenizer.json"):
            shutil.copyfile(default_model_dir() / name, root / name)
    else:
        raise ValueError(f"model: {model!r}, expected one of {MODELS}")
    return root


def engine_options(
    platform: str, plan: EnginePlan, max_model_len: int, speculative: str, overlap: str
) -> dict[str, Any]:
    """The LLM keyword arguments of a run (the result records them)."""
    need = (
        plan.prompt_len + plan.warmup_steps + plan.steps + 2 * plan.profile_steps + plan.diff_k + SLACK_TOKENS
    )
    if max_model_len < need:
        raise ValueError(
            f"max_model_len: {max_model_len}, expected at least {need} "
            f"(prompt_len + warmup_steps + steps + 2 * profile_steps + diff_k + {SLACK_TOKENS})"
        )
    return {
        "platform": platform,
        "load_format": "dummy",
        "max_model_len": max_model_len,
        "max_num_seqs": max(plan.batches),
        "enable_prefix_cache": False,
        "speculative": speculative,
        "overlap": overlap,
    }


def _sync(platform: str) -> None:
    if platform == "cuda":
        import torch

        torch.cuda.synchronize()


def _prompts(rng: np.random.Generator, batch: int, prompt_len: int, vocab: int) -> list[list[int]]:
    """Random token ids from the range the peer draws them from ([1000, vocab - 1000) for the released
    vocabulary; a tiny vocabulary keeps its middle three quarters)."""
    margin = min(1000, vocab // 8)
    return rng.integers(margin, vocab - margin, (batch, prompt_len)).tolist()


def _emitted(events: list[TokenEvent]) -> int:
    return sum(1 for e in events if e.token >= 0)


def _count(events: list[TokenEvent], counts: dict[int, int]) -> set[int]:
    """Adds each event's token to its request's count; returns the requests that got one."""
    got = set()
    for e in (e for e in events if e.token >= 0):
        counts[e.rid] += 1
        got.add(e.rid)
    return got


def _past_prefill(engine: Engine, counts: dict[int, int]) -> int:
    """Steps until every request of `counts` has its first token; returns their count."""
    waiting, steps = set(counts), 0
    while waiting:
        if not engine.has_unfinished:
            raise RuntimeError(f"bench engine: requests {sorted(waiting)[:4]} ended before a first token")
        waiting -= _count(engine.step(), counts)
        steps += 1
    return steps


def _drain(engine: Engine, rids: list[int]) -> None:
    """Abort the loop's requests and run the engine idle, so the next batch starts alone."""
    for rid in rids:
        engine.abort(rid)
    while engine.has_unfinished:
        engine.step()
    for rid in rids:
        engine.release(rid)


def summary(times_ms: list[float], tokens: list[int]) -> dict[str, float]:
    """Step wall time (median, mean, p10, p90 in ms) and tokens per step and per second."""
    return {
        "step_ms_median": statistics.median(times_ms),
        "step_ms_mean": statistics.fmean(times_ms),
        "step_ms_p10": float(np.percentile(times_ms, 10)),
        "step_ms_p90": float(np.percentile(times_ms, 90)),
        "tokens_per_step_mean": statistics.fmean(tokens),
        "tokens_per_s": sum(tokens) / (sum(times_ms) / 1e3),
    }


def loop_case(engine: Engine, plan: EnginePlan, batch: int, rng: np.random.Generator) -> dict[str, Any]:
    """Engine-loop figures of `batch` requests: warm-up steps, then `plan.steps` timed ones. Requests
    ask for every token the context allows, so none ends inside the timed steps (with drafting too)."""
    rids = [LOOP_RID_BASE + i for i in range(batch)]
    max_tokens = engine.config.max_model_len - plan.prompt_len - 1
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompts = _prompts(rng, batch, plan.prompt_len, engine.cfg.text.vocab_size)
    for rid, prompt in zip(rids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    counts = dict.fromkeys(rids, 0)
    prefill_steps = _past_prefill(engine, counts)
    for _ in range(plan.warmup_steps):
        _count(engine.step(), counts)
    # requests done with prefill first decode while the others prefill: their context runs ahead
    context = [plan.prompt_len + n for n in counts.values()]
    times_ms, tokens = [], []
    for _ in range(plan.steps):
        start = time.perf_counter()
        events = engine.step()
        times_ms.append((time.perf_counter() - start) * 1e3)
        tokens.append(_emitted(events))
        if any(e.finished for e in events):
            raise RuntimeError(
                f"bench engine: a request of batch {batch} ended inside the timed steps; "
                f"raise max_model_len ({engine.config.max_model_len})"
            )
    row = {
        "prefill_steps": prefill_steps,
        "context_at_timing": {"min": min(context), "max": max(context)},
        **summary(times_ms, tokens),
    }
    if plan.profile_steps:
        from dsgraph.tools.bench.engine_profile import profile_case

        row["profile"] = profile_case(engine, plan.profile_steps)
    _drain(engine, rids)
    return row


def diff_case(llm: LLM, plan: EnginePlan, batch: int, rng: np.random.Generator) -> dict[str, Any]:
    """Per-step time by differencing: (t(generate 1 + K tokens) - t(generate 1 token)) / K, each on
    fresh prompts, after one warm-up call (with drafting on, a time per token rather than per step)."""
    vocab, platform = llm.engine.cfg.text.vocab_size, llm.engine.config.platform
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    more = SamplingParams(temperature=0, max_tokens=1 + plan.diff_k, ignore_eos=True)

    def timed(params: SamplingParams) -> tuple[float, int]:
        prompts = [{"prompt_token_ids": p} for p in _prompts(rng, batch, plan.prompt_len, vocab)]
        _sync(platform)
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        _sync(platform)
        return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outs)

    timed(more)
    gen1_s, _ = timed(one)
    genk_s, genk_tokens = timed(more)
    return {
        "diff_step_ms": (genk_s - gen1_s) / plan.diff_k * 1e3,
        "gen1_s": gen1_s,
        "genk_s": genk_s,
        "genk_tokens": genk_tokens,
    }


def measure(model_dir: Path, options: dict[str, Any], plan: EnginePlan) -> dict[str, Any]:
    """Builds the engine once, then per batch the loop case and the differencing check."""
    from dsgraph.runtime.llm import LLM

    start = time.perf_counter()
    llm = LLM(model_dir, **options)
    _sync(options["platform"])
    init_s = time.perf_counter() - start
    engine = llm.engine
    rng = np.random.default_rng(0)
    batches = {}
    for batch in plan.batches:
        row = loop_case(engine, plan, batch, rng)
        row.update(diff_case(llm, plan, batch, rng))
        batches[str(batch)] = row
        print(
            f"bench engine: batch {batch}: step median {row['step_ms_median']:.3f} ms, "
            f"{row['tokens_per_step_mean']:.1f} tokens/step, differencing {row['diff_step_ms']:.3f} ms",
            flush=True,
        )
    return {
        "plan": asdict(plan),
        "options": options,
        "engine_config": engine.config.flat(),  # every option by its flat name, the defaults included
        "drafting": engine.spec is not None,
        "overlap_on": engine.overlap is not None,
        "init_s": init_s,
        "batches": batches,
    }
