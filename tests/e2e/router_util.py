"""Engines as `dsgraph serve` processes on loopback (so one can be killed with SIGKILL), `dsgraph router`
in front of them, and a streaming client that records how each stream ended."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

MODEL = "tiny-v41-seed0"  # the embedded model's directory name, the default --served-model-name
README = Path(__file__).resolve().parents[2] / "README.md"
README_PORTS = ("8001", "8002", "8000")  # engine 1, engine 2, router in the README's deployment


def shell_block(doc: Path, marker: str, count: int) -> list[list[str]]:
    """The `count` commands of the ```sh block of `doc` that contains `marker`, as argv lists after
    `dsgraph` (trailing `&` and `# comments` dropped)."""
    blocks = re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S)
    block = next(b for b in blocks if marker in b)
    cmds = [
        shlex.split(re.sub(r"\s+#\s.*$", "", line).strip().removesuffix("&")) for line in block.splitlines()
    ]
    assert len(cmds) == count and all(c[0] == ".venv/bin/dsgraph" for c in cmds), cmds
    return [c[1:] for c in cmds]


def readme_deployment() -> list[list[str]]:
    """The README's three commands (two engines, the router)."""
    return shell_block(README, "dsgraph router --normal", 3)


def on_ports(argv: list[str], ports: dict[str, int]) -> list[str]:
    """`argv` with the README's ports replaced by free ones (also inside URLs)."""
    out = []
    for arg in argv:
        for old, new in ports.items():
            arg = arg.replace(f":{old}", f":{new}") if ":" in arg else (str(new) if arg == old else arg)
        out.append(arg)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log(log_dir: Path | None, name: str) -> Any:
    """Where a process's output goes: a new file in `log_dir` (kept by pytest's tmp_path, so a failure
    can be read afterwards), or nowhere."""
    if log_dir is None:
        return subprocess.DEVNULL
    log_dir.mkdir(parents=True, exist_ok=True)
    return (log_dir / f"{name}-{time.strftime('%H%M%S')}-{time.monotonic_ns() % 10**6}.log").open("wb")


class EngineProcess:
    """A README engine command (`dsgraph serve`) on a fixed loopback port; start() again after it exited
    or was killed. With `log_dir`, each start's output goes to a file there."""

    def __init__(self, argv: list[str], port: int, log_dir: Path | None = None) -> None:
        self.argv, self.port, self.log_dir = argv, port, log_dir
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "dsgraph.tools.cli", *self.argv]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        log = _log(self.log_dir, f"engine-{self.port}")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 300) -> None:
        """Until its /health answers 200. Several engines starting at once on a loaded 2-core machine
        can take minutes, so the wait is long; an engine that exits fails it at once."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc is not None and self.proc.poll() is None, f"engine {self.url} exited"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"engine {self.url} did not become healthy")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


class RouterProcess:
    """The README's router command (its own process: the client's streams do not share its GIL), with
    a short poll interval so the tests need not wait for the default one."""

    def __init__(self, argv: list[str], port: int, *flags: str, log_dir: Path | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "dsgraph.tools.cli", *argv, "--poll-interval", "0.1", *flags]
        log = _log(log_dir, f"router-{port}")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, "the router exited"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError("the router did not become ready")

    def engines(self) -> dict[str, dict[str, Any]]:
        return {e["url"]: e for e in httpx.get(f"{self.url}/engines", timeout=5).json()["engines"]}

    def metric(self, name: str) -> float:
        """The sum of a metric's samples in the router's /metrics."""
        lines = httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines()
        return sum(float(x.split()[-1]) for x in lines if x.startswith(name) and x[len(name)] in " {")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_rejoined(r: RouterProcess, url: str, timeout: float = 20) -> None:
    """Returns once the router has `url` in its pool again (healthy, not draining)."""
    deadline = time.time() + timeout
    while not ((e := r.engines()[url])["healthy"] and not e["draining"]):
        assert time.time() < deadline, f"{url} did not rejoin: {e}"
        time.sleep(0.05)


class Deployment:
    """The README's deployment on free loopback ports: two engines, and the router command to start."""

    def __init__(self) -> None:
        ports = {old: free_port() for old in README_PORTS}
        serve_a, serve_b, route = (on_ports(c, ports) for c in readme_deployment())
        self.engines = [EngineProcess(serve_a, ports["8001"]), EngineProcess(serve_b, ports["8002"])]
        self.router_argv, self.router_port = route, ports["8000"]


@contextmanager
def router(dep: Deployment, *flags: str) -> Iterator[RouterProcess]:
    r = RouterProcess(dep.router_argv, dep.router_port, *flags)
    try:
        r.wait_ready()
        yield r
    finally:
        r.stop()


@dataclass
class StreamResult:
    text: str = ""
    finish: str | None = None  # the finish_reason of the last choice chunk
    done: bool = False  # data: [DONE] arrived
    error: dict[str, Any] | None = None  # an error event
    status: int = 0
    chunks: int = 0
    usage: dict[str, Any] | None = None  # the last chunk's, when the request asked for it
    events: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.error is None and self.finish is not None


def chat_body(prompt: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


async def stream_one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> StreamResult:
    """One chat (a body with messages) or completions stream, read to its end; a connection that breaks
    is recorded, never raised."""
    out = StreamResult()
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    try:
        async with client.stream("POST", f"{url}{path}", json=body) as resp:
            out.status = resp.status_code
            if resp.status_code != 200:
                out.error = json.loads(await resp.aread())
                return out
            async for line in resp.aiter_lines():
                _read_line(out, line)
    except httpx.HTTPError as exc:
        out.events.append(f"transport: {type(exc).__name__}")
    return out


def _read_line(out: StreamResult, line: str) -> None:
    if not line.startswith("data: "):
        return
    data = line[6:]
    if data == "[DONE]":
        out.done = True
        return
    value = json.loads(data)
    if "error" in value:
        out.error = value
        return
    out.usage = value.get("usage") or out.usage
    for choice in value.get("choices", []):
        out.chunks += 1
        out.text += choice.get("delta", {}).get("content") or choice.get("text") or ""
        out.finish = choice.get("finish_reason") or out.finish


def run_streams(url: str, bodies: list[dict[str, Any]], during: Any = None) -> list[StreamResult]:
    """All `bodies` as concurrent streams; `during(results)` (a coroutine function) runs beside them."""

    async def main() -> list[StreamResult]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120), limits=limits) as client:
            tasks = [asyncio.ensure_future(stream_one(client, url, b)) for b in bodies]
            if during is not None:
                await during(tasks)
            return list(await asyncio.gather(*tasks))

    return asyncio.run(main())
