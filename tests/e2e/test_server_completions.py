"""/v1/completions through the real `openai` client (JSON and SSE, echo, logprobs, n, batches), its errors,
and the server's access options: --api-key (Bearer and x-api-key, 401 bodies, /health open), CORS and the
one structured request-log line per request."""

from __future__ import annotations

import json
import logging
import time

import httpx2 as httpx
import pytest

from dsgraph import LLM, SamplingParams
from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.runtime.server.request_log import LOGGER_NAME
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import serving, wait_idle

openai = pytest.importorskip("openai")
MODEL, KEY, MAX_LEN = "tiny-test", "sesame", 128
PROMPT = "W3 W5 W7"


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=MAX_LEN, max_num_seqs=4))
    app = create_app(
        engine, MODEL, recipe_tokenizer(root), api_key=KEY, allowed_origins=["http://ui.example"]
    )
    with serving(app) as url:
        yield url, app.state.server


@pytest.fixture(scope="module")
def offline() -> LLM:
    return LLM(default_model_dir(), max_model_len=MAX_LEN)


def _client(url: str, key: str = KEY):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_completions_match_the_offline_api(server, offline) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    got = _client(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6))[0]
    assert got.object == "text_completion" and got.id.startswith("cmpl-")
    assert got.choices[0].text == want.outputs[0].text
    assert got.choices[0].finish_reason == want.outputs[0].finish_reason
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    assert got.usage.completion_tokens == len(want.outputs[0].token_ids)
    streamed = _client(url).completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.outputs[0].text
    assert chunks[-1].usage.completion_tokens == got.usage.completion_tokens and not chunks[-1].choices


def test_echo_logprobs_n_and_batches(server, offline) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    c = _client(url)
    got = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=2)
    ch = got.choices[0]
    assert ch.text.startswith(PROMPT) and len(ch.logprobs.tokens) == got.usage.prompt_tokens + 3
    assert ch.logprobs.token_logprobs[0] is None and all(v <= 0 for v in ch.logprobs.token_logprobs[1:])
    assert all(len(t) <= 2 for t in ch.logprobs.top_logprobs[1:]) and ch.logprobs.text_offset[0] == 0
    want = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2))[0]
    ids = want.prompt_token_ids
    cold = [want.prompt_logprobs[p][ids[p]].logprob for p in range(1, len(ids))]
    assert ch.logprobs.token_logprobs[1 : len(ids)] == pytest.approx(cold, abs=1e-6)
    scored = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    assert scored.choices[0].text == PROMPT and scored.usage.completion_tokens == 0
    assert scored.choices[0].logprobs.token_logprobs[1:] == pytest.approx(cold, abs=1e-6)
    many = c.completions.create(
        model=MODEL, prompt=[PROMPT, [5, 6, 7]], max_tokens=4, n=2, temperature=1, seed=3
    )
    assert sorted(x.index for x in many.choices) == [0, 1, 2, 3]
    assert many.choices[0].text != many.choices[1].text or many.choices[2].text != many.choices[3].text
    wait_idle(server[1])


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens: 0 must be >= 1"),
        ({"prompt": [], "max_tokens": 2}, 400, "prompt"),
        ({"prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
        ({"prompt": PROMPT, "presence_penalty": 0.5}, 400, "presence_penalty"),
        ({"prompt": PROMPT, "logprobs": 99}, 400, "logprobs: 99 must be in 0..20"),
        ({"prompt": PROMPT, "max_tokens": 500}, 400, "max_tokens: 500"),
        ({"prompt": [[5, 999999]]}, 400, "prompt[0]"),
        ({"prompt": PROMPT, "model": "other"}, 404, "does not exist"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(server, body, status, needle) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, **body}, headers={"x-api-key": KEY})
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    ok = httpx.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2},
        headers={"x-api-key": KEY},
    )
    assert ok.status_code == 200


def test_api_key_bearer_and_x_api_key(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
    with pytest.raises(openai.AuthenticationError):
        _client(url, key="wrong").completions.create(**body)
    assert _client(url).completions.create(**body).choices  # Bearer
    assert httpx.post(f"{url}/v1/completions", json=body, headers={"x-api-key": KEY}).status_code == 200
    none = httpx.post(f"{url}/v1/completions", json=body)
    assert none.status_code == 401 and none.json()["error"]["code"] == "invalid_api_key"
    claude = httpx.post(f"{url}/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": []})
    assert claude.status_code == 401 and claude.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/metrics").status_code == 200
    assert httpx.get(f"{url}/v1/models").status_code == 401


def test_cors_preflight_and_headers(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    pre = httpx.options(
        f"{url}/v1/completions",
        headers={"origin": "http://ui.example", "access-control-request-method": "POST"},
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://ui.example"
    other = httpx.get(f"{url}/health", headers={"origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def _log_lines(caplog) -> int:  # type: ignore[no-untyped-def]
    return sum(rec.name == LOGGER_NAME for rec in caplog.records)


def test_one_structured_log_line_per_request(server, caplog) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        r = httpx.post(
            f"{url}/v1/completions",
            # unseeded sampling may draw the end token first: the count under test is the one asked for
            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "ignore_eos": True},
            headers={"x-api-key": KEY},
        )
        httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": PROMPT})
        chat = {
            "model": MODEL,
            "max_tokens": 2,
            "temperature": 0,  # greedy: the end token is not drawn in 2 steps (chat has no ignore_eos)
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
        }
        httpx.post(f"{url}/v1/chat/completions", json=chat, headers={"x-api-key": KEY})
        # a stream's line is written when the server closes it, which may be just after the client has read
        # the last chunk
        deadline = time.monotonic() + 10
        while _log_lines(caplog) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == LOGGER_NAME]
    assert len(lines) == 3
    ok, denied, streamed = lines
    assert (streamed["endpoint"], streamed["status"], streamed["completion_tokens"]) == (
        "/v1/chat/completions",
        200,
        2,
    )
    assert streamed["prompt_tokens"] == 3 and streamed["ttft_s"] is not None
    assert ok["request_id"] == r.headers["x-request-id"] and ok["endpoint"] == "/v1/completions"
    assert (ok["status"], ok["prompt_tokens"], ok["completion_tokens"]) == (200, 3, 3)
    assert ok["ttft_s"] is not None and 0 < ok["ttft_s"] <= ok["total_s"] and ok["cached_tokens"] >= 0
    assert denied["status"] == 401 and denied["ttft_s"] is None
