"""Hostile load and body memory of `dsgraph serve` on loopback with the embedded tiny model.

`load`: `streams` good streaming requests (greedy and seeded) at once, with hostile traffic mixed in
(oversized and deeply nested bodies, out-of-range fields, unknown routes, clients leaving mid-stream or
while sending their body); then every good request again alone. Reports lost requests, unexpected 5xx and
outputs that differ from their run alone (all three must be 0).
`body_memory`: the server process's resident memory before, during and after large request bodies.

    python -m dsgraph.tools.bench.server_hostile --streams 256 --out bench/results/server-hostile.json
    python -m dsgraph.tools.bench.server_hostile --memory-only --out bench/results/server-body-memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the HTTP client the `openai` package ships on
import uvicorn

MODEL = "tiny-test"
CHAT = "/v1/chat/completions"


@contextmanager
def tiny_server(max_num_seqs: int = 16, **limits: int) -> Iterator[tuple[str, Any]]:
    """The tiny model served on a free loopback port in this process; yields (url, ServerState)."""
    from dsgraph.runtime.engine import Engine, EngineConfig
    from dsgraph.runtime.server.app import create_app
    from dsgraph.runtime.server.lifecycle import DrainingServer
    from dsgraph.runtime.server.limits import ServerLimits
    from dsgraph.runtime.server.protocol import recipe_tokenizer
    from dsgraph.tools.generate_cmd import default_model_dir

    root = default_model_dir()
    engine = Engine(root, EngineConfig.from_flat(max_model_len=128, max_num_seqs=max_num_seqs))
    app = create_app(engine, MODEL, recipe_tokenizer(root), limits=ServerLimits(**limits))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = DrainingServer(
        uvicorn.Config(app, log_level="error", timeout_graceful_shutdown=5), app.state.server.drain
    )
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.server
    finally:
        srv.should_exit = True
        thread.join(15)
        app.state.server.close()


def _good(i: int) -> dict[str, Any]:
    words = " ".join(f"W{(i * 7 + k) % 200 + 3}" for k in range(1 + i % 5))
    sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 1, "seed": i}
    return {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 8, **sampling}


def _hostile(i: int, max_body: int) -> tuple[str, str, bytes | None, set[int]]:
    """(method, path, body, accepted statuses) of the i-th hostile request."""
    base = json.dumps(_good(i))[:-1]
    kinds = [
        ("POST", CHAT, (base + ', "pad": "' + "x" * max_body + '"}').encode(), {413}),
        ("POST", CHAT, (base + ', "d": ' + "[" * 3000 + "]" * 3000 + "}").encode(), {400}),
        ("POST", CHAT, (base + ', "max_tokens": -5}').encode(), {400}),
        ("POST", "/v1/messages", (base + ', "max_tokens": null}').encode(), {400}),
        ("POST", CHAT, (base + ', "temperature": NaN}').encode(), {400}),
        ("GET", "/v1/../../etc/passwd", None, {404}),
        ("DELETE", CHAT, None, {405}),
        ("POST", CHAT, b"[1, 2", {400}),
    ]
    return kinds[i % len(kinds)]


async def _stream(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, str]:
    async with client.stream("POST", CHAT, json={**body, "stream": True}) as r:
        text = "".join([line async for line in r.aiter_lines()])
    return r.status_code, _content(text)


def _content(sse: str) -> str:
    """The concatenated delta contents of a chat SSE stream; "<error>" if it ended in an error event."""
    out = []
    for part in sse.split("data: ")[1:]:
        if part.startswith("[DONE]"):
            continue
        event = json.loads(part)
        if "error" in event:
            return "<error>"
        out += [c["delta"].get("content") or "" for c in event.get("choices", [])]
    return "".join(out)


async def _leaver(url: str, i: int) -> str:
    """A client that leaves mid-stream (even i) or while sending its body (odd i)."""
    host, port = url.removeprefix("http://").split(":")
    if i % 2:
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-length: 999\r\n\r\n{{".encode())
        await writer.drain()
        writer.close()
        return "left-while-sending"
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        body = {**_good(i), "stream": True, "max_tokens": 60}
        async with client.stream("POST", CHAT, json=body) as r:
            async for _ in r.aiter_lines():
                break
    return "left-mid-stream"


async def _load(url: str, streams: int, hostile: int, max_body: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=streams + hostile + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def bad(i: int) -> str:
            method, path, body, ok = _hostile(i, max_body)
            try:
                r = await client.request(method, path, content=body)
            except httpx.TransportError:
                return "closed-by-server" if i % 8 == 0 else "lost"  # an oversized body may be cut off
            return "expected" if r.status_code in ok else f"unexpected-{r.status_code}"

        tasks = [_stream(client, _good(i)) for i in range(streams)]
        extra = [bad(i) for i in range(hostile)] + [_leaver(url, i) for i in range(hostile // 4)]
        results = await asyncio.gather(*tasks, *extra, return_exceptions=True)
        together, others = results[:streams], results[streams:]
        alone = [await _stream(client, _good(i)) for i in range(streams)]
    lost = sum(isinstance(r, BaseException) or r[0] != 200 or r[1] == "<error>" for r in together)
    mismatched = sum(
        1 for a, b in zip(together, alone, strict=True) if isinstance(a, BaseException) or a[1] != b[1]
    )
    outcomes = Counter(r if isinstance(r, str) else type(r).__name__ for r in others)
    unexpected_5xx = sum(n for k, n in outcomes.items() if k.startswith("unexpected-5"))
    return {
        "streams": streams,
        "hostile_requests": len(others),
        "lost": lost,
        "unexpected_5xx": unexpected_5xx,
        "outputs_differing_from_alone": mismatched,
        "hostile_outcomes": dict(sorted(outcomes.items())),
    }


def load(url: str, streams: int, hostile: int, max_body: int) -> dict[str, Any]:
    return asyncio.run(_load(url, streams, hostile, max_body))


def rss_mib() -> float:
    """This process's resident memory (the server runs in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def body_memory(url: str, max_body: int, rounds: int) -> dict[str, Any]:
    """RSS before, at the peak of and after `rounds` bodies just under the limit (valid JSON, far over
    the context: a 400 after full preparation) and `rounds` bodies over it (413)."""
    words = "W3 " * ((max_body - 200) // 3)
    under = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": words}]}).encode()
    over = under + b" " * max_body
    httpx.post(f"{url}{CHAT}", json=_good(0), timeout=60)  # warm
    before, statuses, after_round = rss_mib(), Counter(), []
    peak, done = [before], threading.Event()

    def sample() -> None:  # the peak happens inside a request: sample while they run
        while not done.wait(0.01):
            peak[0] = max(peak[0], rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for _ in range(rounds):
        for body in (under, over):
            try:
                statuses[httpx.post(f"{url}{CHAT}", content=body, timeout=300).status_code] += 1
            except httpx.TransportError:
                statuses["closed-by-server"] += 1
        after_round.append(round(rss_mib(), 1))
    done.set()
    sampler.join()
    time.sleep(1.0)
    after = rss_mib()
    return {
        "body_bytes_under_limit": len(under),
        "body_bytes_over_limit": len(over),
        "rounds": rounds,
        "statuses": {str(k): v for k, v in statuses.items()},
        "rss_mib_before": round(before, 1),
        "rss_mib_peak": round(peak[0], 1),
        "rss_mib_after_each_round": after_round,
        "rss_mib_after": round(after, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--hostile", type=int, default=128)
    p.add_argument("--memory-rounds", type=int, default=10)
    p.add_argument("--memory-only", action="store_true", help="measure body_memory alone (no load run)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from dsgraph.runtime.server.limits import ServerLimits

    max_body = ServerLimits().max_body_bytes
    with tiny_server() as (url, _):
        result: dict[str, Any] = {}
        if not args.memory_only:
            result["load"] = load(url, args.streams, args.hostile, max_body)
        result["body_memory"] = body_memory(url, max_body, args.memory_rounds)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
