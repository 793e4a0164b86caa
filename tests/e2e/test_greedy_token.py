"""The token-only sampling variant ("greedy_token", ops/sampling.py: argmax, log-probabilities not
computed) changes nothing a user sees: the same greedy requests, with it and with it forced off, give
identical outputs through the offline API (token ids, text, finish reasons, no logprobs) and through the
OpenAI-compatible server (whole JSON bodies and SSE chunks: text, finish reasons, usage, `logprobs`
null), with plain and with overlapped steps (whose bad-row marks travel in the logprob,
runtime/row_checks.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx
import pytest

from dsgraph.runtime import sampler as sampler_module
from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import serving, wait_idle

MODEL, MAX_LEN = "tiny-test", 128
PROMPTS = ["W3 W5 W7", "W11 W2", "W8 W8 W1 W9 W4", "W6"]
BASE: dict[str, Any] = {"max_model_len": MAX_LEN, "max_num_seqs": 4, "enable_prefix_cache": False}
# (path, body) of the server requests: all greedy; the last one asks for logprobs (the variant is not
# taken for it, and its logprobs are shown either way)
BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": PROMPTS, "max_tokens": 8, "temperature": 0}),
    ("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0, "n": 2, "stop": ["W9"]}),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 6, "temperature": 0},
    ),
    ("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 5, "temperature": 0, "logprobs": 2}),
]


@pytest.fixture
def variant(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], list[str]]:
    """`variant(allowed)`: from now on the sampler may take "greedy_token" (or never, as if every row read
    its log-probabilities); returns the list the processing of each sampling call is appended to."""
    choose = sampler_module.processing_for

    def use(allowed: bool) -> list[str]:
        chosen: list[str] = []

        def processing_for(rows: Any, vocab_size: int, read_logprobs: bool = True) -> str:
            chosen.append(choose(rows, vocab_size, read_logprobs or not allowed))
            return chosen[-1]

        monkeypatch.setattr(sampler_module, "processing_for", processing_for)
        return chosen

    return use


def _both(variant: Callable[[bool], list[str]], run: Callable[[], Any]) -> tuple[Any, Any]:
    """run() with the variant, then with it forced off; each must have taken it, or not, somewhere."""
    chosen = variant(True)
    got = run()
    assert "greedy_token" in chosen
    chosen = variant(False)
    want = run()
    assert chosen and "greedy_token" not in chosen
    return got, want


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_offline_outputs_are_the_same_with_the_variant_and_without(variant, overlap: str) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(default_model_dir(), overlap=overlap, **BASE)
    assert (llm.engine.overlap is not None) == (overlap == "on")
    params = [
        SamplingParams(temperature=0, max_tokens=9),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=1e-6, max_tokens=7, stop=["W4"]),
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    ]

    # read off the logits, not the samples: prompt logprobs, and forced tokens (plain steps)
    from_logits = [
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, prompt_logprobs=1),
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, golden_token_ids=(7, 200, 7)),
    ]

    def run() -> list[Any]:
        single = llm.generate(PROMPTS[3], params[0])  # batch 1: the decode step the variant is for
        outs = single + llm.generate(PROMPTS, params) + llm.generate(PROMPTS[:2], from_logits)
        return [
            (o.prompt_token_ids, o.prompt_logprobs, c.token_ids, c.text, c.finish_reason, c.stop_reason)
            + (c.logprobs, c.cumulative_logprob)
            for o in outs
            for c in o.outputs
        ]

    got, want = _both(variant, run)
    assert got == want
    assert all(len(o[2]) > 0 and o[6] is None and o[7] is None for o in got)
    assert got[-2][1] is not None and got[-1][2][:3] == (7, 200, 7)


@pytest.fixture(scope="module", params=["off", "on"])
def server(request) -> Iterator[tuple[str, Any]]:  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(overlap=request.param, **BASE))
    assert (engine.overlap is not None) == (request.param == "on")
    app = create_app(engine, MODEL, recipe_tokenizer(root))
    with serving(app) as url:
        yield url, app.state.server


def _body(r: httpx.Response) -> dict[str, Any]:
    """A JSON response without what differs between any two calls (its id and creation time)."""
    assert r.status_code == 200, r.text
    return {k: v for k, v in r.json().items() if k not in ("id", "created")}


def _chunks(r: httpx.Response) -> dict[Any, list[dict[str, Any]]]:
    """SSE chunks without id and creation time, in order per choice index (the choices of n > 1 stream
    interleaved as their tokens come), the chunks without a choice (usage) under None."""
    assert r.status_code == 200, r.text
    lines = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    out: dict[Any, list[dict[str, Any]]] = {}
    for line in lines[:-1]:
        chunk = {k: v for k, v in json.loads(line).items() if k not in ("id", "created")}
        (index,) = {c["index"] for c in chunk["choices"]} or {None}
        out.setdefault(index, []).append(chunk)
    return out


def test_server_responses_are_the_same_with_the_variant_and_without(variant, server) -> None:  # type: ignore[no-untyped-def]
    url, state = server

    def run() -> list[Any]:
        out: list[Any] = []
        for path, body in BODIES:
            out.append(_body(httpx.post(f"{url}{path}", json={"model": MODEL, **body}, timeout=60)))
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            out.append(_chunks(httpx.post(f"{url}{path}", json={"model": MODEL, **streamed}, timeout=60)))
        wait_idle(state)
        return out

    got, want = _both(variant, run)
    assert got == want
    first = got[0]
    assert len(first["choices"]) == len(PROMPTS) and first["usage"]["completion_tokens"] > 0
    assert all(c["logprobs"] is None and c["text"] for c in first["choices"])
    assert got[-2]["choices"][0]["logprobs"]["token_logprobs"]  # asked for: shown, and equal above
