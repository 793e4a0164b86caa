"""The server on a tiny DeepSeek-V4 checkpoint: the same endpoints as for V4.1, a bad request answered
with the field named, and the server still serving after it; and a server drafting with the MTP layer
(`speculative="mtp"`) whose prefix-cache hit answers with the tokens of the cold request."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx  # the HTTP client the `openai` package ships on
import pytest

from dsgraph.models.deepseek_v4.tiny import make_tiny
from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.engine_config import CacheConfig, SchedulingConfig, SpeculativeConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from tests.e2e.serve_util import serving


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = Path(make_tiny(tmp_path_factory.mktemp("v4") / "tiny-v4", seed=0))
    engine = Engine(root, EngineConfig.from_flat(max_model_len=256, max_num_seqs=2))
    with serving(create_app(engine, "v4", recipe_tokenizer(root))) as base:
        yield base


def test_models_completions_and_chat(url: str) -> None:
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "v4"
    body = {"model": "v4", "prompt": "w1 W2", "max_tokens": 4, "temperature": 0}
    out = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
    assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["text"]
    chat = {"model": "v4", "messages": [{"role": "user", "content": "w1 W2"}], "max_tokens": 3}
    reply = httpx.post(url + "/v1/chat/completions", json=chat, timeout=120).json()
    assert reply["choices"][0]["message"]["role"] == "assistant"


def test_a_bad_request_names_the_field_and_the_server_keeps_serving(url: str) -> None:
    bad = httpx.post(
        url + "/v1/completions", json={"model": "v4", "prompt": [99999], "max_tokens": 2}, timeout=60
    )
    assert bad.status_code == 400 and "99999 must be a token id" in bad.json()["error"]["message"]
    good = httpx.post(
        url + "/v1/completions", json={"model": "v4", "prompt": [5, 6], "max_tokens": 2}, timeout=60
    )
    assert good.status_code == 200


PROMPT = [3 + (i * 37) % 250 for i in range(70)]


@pytest.fixture(scope="module")
def drafting(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    overrides = {"num_nextn_predict_layers": 1}
    root = Path(make_tiny(tmp_path_factory.mktemp("v4-mtp") / "tiny-v4-mtp", seed=0, overrides=overrides))
    # 4-entry pages: prefix-cache hits come in multiples of 4 x 16 (the tiny HCA ratio) = 64 tokens
    config = EngineConfig(
        max_model_len=256,
        numerics="reference",
        scheduler=SchedulingConfig(max_num_seqs=2),
        cache=CacheConfig(page_size=4),
        speculative=SpeculativeConfig(mode="mtp", verify_schedule="fixed"),
    )
    engine = Engine(root, config)
    with serving(create_app(engine, "v4", recipe_tokenizer(root))) as base:
        yield base, engine


def test_a_prefix_hit_while_drafting_gives_the_cold_tokens(drafting) -> None:  # type: ignore[no-untyped-def]
    url, engine = drafting
    body = {"model": "v4", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 0}
    cold = httpx.post(url + "/v1/completions", json=body, timeout=300).json()
    warm = httpx.post(url + "/v1/completions", json=body, timeout=300).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == 64
    assert warm["choices"][0]["logprobs"]["tokens"] == cold["choices"][0]["logprobs"]["tokens"]
    assert len(cold["choices"][0]["logprobs"]["tokens"]) == 8
    assert engine.spec_stats()["verified_tokens"] > 0
