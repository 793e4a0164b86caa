"""`dsgraph bench serve`: an online load generator against any OpenAI-compatible server (ours, vLLM's,
SGLang's), like `vllm bench serve`. Requests stream from /v1/completions (token-id prompts: exact input
lengths) or /v1/chat/completions (text prompts), arrive as a Poisson process at `request_rate` (inf:
all at once) and at most `max_concurrency` run at a time. Each request records its time to first token,
the gaps between streamed chunks (ITL) and its end-to-end latency; a run reports their percentiles,
TPOT = (latency - TTFT) / (output tokens - 1), and request, input and output throughput."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

__all__ = [
    "LoadSpec",
    "Prompt",
    "RequestResult",
    "dataset_prompts",
    "random_prompts",
    "run_load",
    "summarize",
]


@dataclass(frozen=True)
class Prompt:
    ids: list[int] | None  # token ids (the completions endpoint), or None for `text`
    text: str
    max_tokens: int


@dataclass(frozen=True)
class LoadSpec:
    base_url: str
    endpoint: str  # "/v1/completions" or "/v1/chat/completions"
    model: str
    request_rate: float = math.inf
    max_concurrency: int | None = None
    api_key: str | None = None
    seed: int = 0
    ignore_eos: bool = True  # exact output lengths (vLLM, SGLang and dsgraph accept the field)
    timeout_s: float = 600.0


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None


def random_prompts(
    n: int, input_len: int, output_len: int, range_ratio: float, seed: int, vocab: int
) -> list[Prompt]:
    """`n` prompts of random token ids in [3, vocab) (ids below 3 are BOS/EOS/pad in DeepSeek's vocabulary),
    lengths uniform in len * [1 - range_ratio, 1 + range_ratio]."""
    rng = random.Random(seed)

    def length(base: int) -> int:
        return max(1, rng.randint(int(base * (1 - range_ratio)), int(base * (1 + range_ratio))))

    out = []
    for _ in range(n):
        ids = [rng.randrange(3, vocab) for _ in range(length(input_len))]
        out.append(Prompt(ids, " ".join(f"w{t}" for t in ids), length(output_len)))
    return out


def dataset_prompts(path: Path, n: int, output_len: int) -> list[Prompt]:
    """Prompts of a JSONL file: {"prompt": text, "max_tokens": k (optional)} per line; the first n."""
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{i + 1}: expected an object with a string 'prompt'")
        out.append(Prompt(None, row["prompt"], int(row.get("max_tokens", output_len))))
        if len(out) == n:
            break
    return out


def _body(spec: LoadSpec, p: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {"model": spec.model, "max_tokens": p.max_tokens, "stream": True, "temperature": 0}
    body |= {"stream_options": {"include_usage": True}, "ignore_eos": spec.ignore_eos}
    if spec.endpoint.endswith("/chat/completions"):
        return body | {"messages": [{"role": "user", "content": p.text}]}
    return body | {"prompt": p.ids if p.ids is not None else p.text}


def _delta(chunk: dict[str, Any]) -> str:
    choice = (chunk.get("choices") or [{}])[0]
    if "text" in choice:
        return choice["text"] or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


async def _one(client: httpx.AsyncClient, spec: LoadSpec, p: Prompt) -> RequestResult:
    start = time.perf_counter()
    res, last, chunks = RequestResult(ok=False), start, 0
    try:
        async with client.stream("POST", spec.endpoint, json=_body(spec, p)) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = str(chunk["error"])
                    return res
                now = time.perf_counter()
                if _delta(chunk):
                    chunks += 1
                    if res.ttft_s is None:
                        res.ttft_s = now - start
                    else:
                        res.itl_s.append(now - last)
                    last = now
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens, res.output_tokens = usage["prompt_tokens"], usage["completion_tokens"]
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.latency_s = time.perf_counter() - start
    res.output_tokens = res.output_tokens or chunks
    res.ok = res.ttft_s is not None
    res.error = None if res.ok else "no output"
    return res


async def run_load(spec: LoadSpec, prompts: list[Prompt]) -> tuple[list[RequestResult], float]:
    """Send every prompt; returns the results in prompt order and the run's wall time."""
    rng = random.Random(spec.seed)
    gate = asyncio.Semaphore(spec.max_concurrency or len(prompts) or 1)
    headers = {"authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=spec.base_url, headers=headers, timeout=spec.timeout_s, limits=limits
    ) as client:

        async def gated(p: Prompt) -> RequestResult:
            async with gate:
                return await _one(client, spec, p)

        start, tasks = time.perf_counter(), []
        for p in prompts:
            tasks.append(asyncio.ensure_future(gated(p)))
            if math.isfinite(spec.request_rate):
                await asyncio.sleep(rng.expovariate(spec.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def _stats(values: list[float], percentiles: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, **{f"p{q:g}": None for q in percentiles}}
    xs = sorted(values)

    def pct(q: float) -> float:  # linear interpolation between closest ranks, as numpy's default
        k = (len(xs) - 1) * q / 100
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"mean": sum(xs) / len(xs), "median": pct(50), **{f"p{q:g}": pct(q) for q in percentiles}}


def summarize(results: list[RequestResult], duration_s: float, percentiles: list[float]) -> dict[str, Any]:
    """The run's metrics (seconds; throughputs per second of wall time)."""
    ok = [r for r in results if r.ok]
    tpot = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]  # type: ignore[operator]
    inp, out = sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok)
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration_s,
        "total_input_tokens": inp,
        "total_output_tokens": out,
        "request_throughput": len(ok) / duration_s,
        "input_throughput": inp / duration_s,
        "output_throughput": out / duration_s,
        "total_token_throughput": (inp + out) / duration_s,
        "ttft_s": _stats([r.ttft_s for r in ok if r.ttft_s is not None], percentiles),
        "tpot_s": _stats(tpot, percentiles),
        "itl_s": _stats([g for r in ok for g in r.itl_s], percentiles),
        "e2el_s": _stats([r.latency_s for r in ok], percentiles),
        "requests": [asdict(r) for r in results],
    }
