"""Hostile input against the server on loopback (the tiny random model): bounded bodies, nesting and
arrays, fields named in every error, token limits and seeds on every endpoint, status counting of
disconnects and unknown routes, the surface, and the cases handled well before (over-long prompts, wrong
types, unknown models, path traversal, pipelining, slow clients). Every case checks the status, the
protocol's error shape, and that the server still serves afterwards."""

from __future__ import annotations

import json
import socket
import time

import httpx2 as httpx  # the HTTP client the `openai` package ships on
import pytest

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.limits import ServerLimits
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import scrape, serving

MODEL = "tiny-test"
MESSAGES = [{"role": "user", "content": "W3 W5 W7"}]
LIMITS = ServerLimits(max_body_bytes=64 * 1024, max_json_depth=32, max_array_items=100)
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=128, max_num_seqs=4))
    app = create_app(engine, MODEL, recipe_tokenizer(root), limits=LIMITS)
    with serving(app) as url:
        yield url, app.state.server


def good(api: str, **kw: object) -> dict:  # type: ignore[type-arg]
    if api == "responses":
        return {"model": MODEL, "input": "W3 W5 W7", "max_output_tokens": 4, **kw}
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **kw}


def check_error(api: str, r: httpx.Response, status: int, *needles: str) -> dict:  # type: ignore[type-arg]
    """The protocol's error shape with `status`; returns the inner error object."""
    assert r.status_code == status, r.text
    body = r.json()
    if api == "messages":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    for needle in needles:
        assert needle in body["error"]["message"], body
    return body["error"]


def still_serving(url: str) -> None:
    assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
    r = httpx.post(f"{url}/v1/chat/completions", json=good("chat"), timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3, r.text


@pytest.mark.parametrize("api", list(PATHS))
def test_a_body_over_the_limit_is_a_413(server, api: str) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = json.dumps(good(api, padding="x" * LIMITS.max_body_bytes)).encode()
    r = httpx.post(f"{url}{PATHS[api]}", content=body, headers={"content-type": "application/json"})
    check_error(api, r, 413, f"the limit is {LIMITS.max_body_bytes} bytes")
    still_serving(url)


def test_a_chunked_body_over_the_limit_is_refused_while_it_arrives(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    sent = []

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(64):  # four times the limit, if it were all read
            sent.append(1)
            yield b" " * 4096

    try:
        r = httpx.post(f"{url}/v1/chat/completions", content=chunks(), timeout=10)
        check_error("chat", r, 413, "the limit is")
    except httpx.TransportError:
        pass  # the server may close the connection before the client has sent everything
    still_serving(url)


@pytest.mark.parametrize("api", list(PATHS))
@pytest.mark.parametrize("depth", [1000, 5000])
def test_deep_nesting_is_a_400_naming_the_limit(server, api: str, depth: int) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = json.dumps(good(api))[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    r = httpx.post(f"{url}{PATHS[api]}", content=body.encode())
    check_error(api, r, 400, f"nested {depth + 1} levels deep, the limit is {LIMITS.max_json_depth}")
    still_serving(url)


def test_brackets_inside_strings_do_not_count_as_nesting(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    r = httpx.post(f"{url}/v1/chat/completions", json=good("chat", user="[[[[{{{{" * 100 + '\\"]'))
    assert r.status_code == 200, r.text


def test_a_long_array_is_a_400_naming_the_field(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    r = httpx.post(f"{url}/v1/chat/completions", json=good("chat", stop=["a"] * 101))
    err = check_error("chat", r, 400, "stop: an array of 101 items, the limit is 100")
    assert err["param"] == "stop"
    still_serving(url)


@pytest.mark.parametrize(
    ("api", "fields", "needles"),
    [
        ("chat", {"max_tokens": -5}, ["max_tokens: -5", "[1, 4294967295]"]),
        ("chat", {"max_completion_tokens": 0}, ["max_completion_tokens: 0", "[1, 4294967295]"]),
        ("chat", {"max_completion_tokens": -1}, ["max_completion_tokens: -1"]),
        ("chat", {"temperature": 7}, ["temperature: 7", "[0, 2]"]),
        ("chat", {"top_logprobs": 300, "logprobs": True}, ["top_logprobs: 300", "[0, 20]"]),
        ("chat", {"seed": 2**70}, [f"seed: {2**70}"]),
        ("chat", {"n": 3}, ["n: 3", "[1, 1]"]),
        ("chat", {"reasoning_effort": "bogus"}, ["reasoning_effort: bogus", "expected one of"]),
        ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, ["messages[0].role: wizard"]),
        ("chat", {"max_tokens": "5"}, ["max_tokens: '5' has type str"]),
        ("chat", {"presence_penalty": "x"}, ["presence_penalty: x, expected a number"]),
        ("chat", {"stream_options": {"include_usage": "yes"}}, ["stream_options.include_usage: yes"]),
        ("chat", {"stop": 5}, ["stop: 5 has type int"]),
        ("responses", {"max_output_tokens": 0}, ["max_output_tokens: 0"]),
        ("messages", {"max_tokens": None}, ["max_tokens: required"]),
        ("messages", {"temperature": 1.5}, ["temperature: 1.5", "[0, 1]"]),
        ("messages", {"top_k": -2}, ["top_k: -2"]),
    ],
)
def test_validation_errors_name_field_value_and_range(server, api, fields, needles) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = {k: v for k, v in {**good(api), **fields}.items() if v is not None}
    r = httpx.post(f"{url}{PATHS[api]}", json=body)
    check_error(api, r, 400, *needles)
    still_serving(url)


def test_nan_in_json_names_the_field(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = json.dumps(good("chat"))[:-1] + ', "temperature": NaN}'
    r = httpx.post(f"{url}/v1/chat/completions", content=body.encode())
    err = check_error("chat", r, 400, "temperature: nan, expected a finite number")
    assert err["param"] == "temperature"
    r = httpx.post(f"{url}/v1/chat/completions", content=body.replace("NaN", "nul").encode())
    check_error("chat", r, 400, "invalid JSON request (in field 'temperature')")


def _completion_tokens(url: str, api: str, body: dict) -> int:  # type: ignore[type-arg]
    r = httpx.post(f"{url}{PATHS[api]}", json=body, timeout=30)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage.get("completion_tokens", usage.get("output_tokens"))


def test_max_completion_tokens_is_honoured_and_the_smaller_limit_wins(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    base = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "ignore_eos": True}
    assert _completion_tokens(url, "chat", {**base, "max_completion_tokens": 3}) <= 3
    assert _completion_tokens(url, "chat", {**base, "max_completion_tokens": 2, "max_tokens": 6}) <= 2
    assert _completion_tokens(url, "chat", {**base, "max_completion_tokens": 6, "max_tokens": 1}) <= 1
    r = httpx.post(f"{url}/v1/chat/completions", json={**base, "max_completion_tokens": 10**6})
    check_error("chat", r, 400, "max_completion_tokens: 1000000, expected at most")


@pytest.mark.parametrize("api", list(PATHS))
def test_seed_is_honoured_on_every_endpoint(server, api: str) -> None:  # type: ignore[no-untyped-def]
    url, _ = server

    def text(seed: int) -> str:
        r = httpx.post(f"{url}{PATHS[api]}", json=good(api, temperature=1, seed=seed), timeout=30)
        assert r.status_code == 200, r.text
        out = r.json()
        if api == "chat":
            return out["choices"][0]["message"]["content"]
        if api == "responses":
            return json.dumps([part for item in out["output"] for part in item.get("content", [])])
        return json.dumps(out["content"])

    runs = {seed: text(seed) for seed in range(6)}
    assert text(3) == runs[3]  # the same seed, the same output
    assert len(set(runs.values())) > 1  # the seed is not ignored


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_docs_and_schema_are_off_by_default(server, path: str) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    assert httpx.get(f"{url}{path}").status_code == 404


def test_404_and_405_are_counted_and_answered_with_the_error_shape(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    before = scrape(url)
    r404 = httpx.get(f"{url}/v1/nothing/../../etc/passwd")
    r405 = httpx.get(f"{url}/v1/chat/completions")
    check_error("chat", r404, 404)
    check_error("chat", r405, 405)
    after = scrape(url)
    for status in ("404", "405"):
        key = f'dsgraph_requests_total{{endpoint="none",status="{status}"}}'
        assert after[key] - before.get(key, 0) == 1


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _wait_count(url: str, key: str, want: float) -> None:
    deadline = time.time() + 10
    while scrape(url).get(key, 0) < want:
        assert time.time() < deadline, f"{key} never reached {want}"
        time.sleep(0.05)


def test_a_client_leaving_while_sending_its_body_is_a_499(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    key = 'dsgraph_requests_total{endpoint="chat",status="499"}'
    before = scrape(url).get(key, 0)
    s = _raw(url)
    s.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"model":')
    time.sleep(0.2)
    s.close()
    _wait_count(url, key, before + 1)
    errors = {k: v for k, v in scrape(url).items() if 'status="500"' in k}
    assert not errors, errors
    still_serving(url)


def test_a_client_leaving_mid_stream_is_a_499(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    key = 'dsgraph_requests_total{endpoint="chat",status="499"}'
    before = scrape(url).get(key, 0)
    body = good("chat", stream=True, max_tokens=100, ignore_eos=True)
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    _wait_count(url, key, before + 1)
    still_serving(url)


def test_pipelined_requests_on_one_connection_are_answered_in_order(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    bodies = [json.dumps(good("chat", max_tokens=n)).encode() for n in (1, 2)]
    req = b"".join(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(b)}\r\n\r\n".encode()
        + b
        for b in bodies
    )
    s = _raw(url)
    s.sendall(req)
    data, deadline = b"", time.time() + 20
    while data.count(b"HTTP/1.1 200") < 2 and time.time() < deadline:
        data += s.recv(65536)
    s.close()
    assert data.count(b"HTTP/1.1 200") == 2, data[:500]
    still_serving(url)


def test_a_slow_client_is_served(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    body = json.dumps(good("chat")).encode()
    s = _raw(url)
    s.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n".encode()
    )
    for i in range(0, len(body), 16):
        s.sendall(body[i : i + 16])
        time.sleep(0.01)
    data = s.recv(65536)
    s.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:300]


@pytest.mark.parametrize(
    ("api", "fields", "status", "needle"),
    [
        ("chat", {"messages": [{"role": "user", "content": "W3 " * 200}]}, 400, "context length"),
        ("chat", {"model": "other"}, 400, "other"),
        ("messages", {"model": "../../etc/passwd"}, 400, "etc/passwd"),
        ("chat", {"messages": "W3"}, 400, "messages: 'W3' has type str"),
        ("responses", {"input": 5}, 400, "input: 5 has type int"),
    ],
)
def test_the_cases_handled_before_stay_handled(server, api, fields, status, needle) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    r = httpx.post(f"{url}{PATHS[api]}", json={**good(api), **fields})
    check_error(api, r, status, needle)
    still_serving(url)


def test_a_request_body_that_is_not_an_object_is_a_400(server) -> None:  # type: ignore[no-untyped-def]
    url, _ = server
    for text in (b"[1, 2]", b'"x"', b"", b"\xff\xfe"):
        r = httpx.post(f"{url}/v1/chat/completions", content=text)
        check_error("chat", r, 400)
    still_serving(url)
