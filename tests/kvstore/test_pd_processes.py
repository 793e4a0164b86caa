"""`dsgraph serve --engine-type prompt|completion` as two processes on 127.0.0.1 sharing a store
directory, as the README starts them: one client gets a NORMAL engine's completion; the completion server
killed mid-stream ends that request with an error, a request while it is down gets an error status, and
once it is back (a new process: the store survives) the pair serves again. No request is lost silently."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import pytest

from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import scrape, serving
from tests.kvstore.pd_util import MODEL, engine

PROMPT = [(3 * i + 1) % 120 + 5 for i in range(40)]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _serve(port: int, *flags: str) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [
        sys.executable,
        "-m",
        "dsgraph.tools.cli",
        "serve",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
    ]
    cmd += ["--max-model-len", "128", "--max-num-seqs", "4", "--pd-transport", "torch", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "server did not start"
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _complete(url: str, max_tokens: int = 6) -> httpx.Response:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


@pytest.fixture(scope="module")
def normal_text() -> str:
    with serving(create_app(engine("normal"), MODEL, recipe_tokenizer(default_model_dir()))) as url:
        return _complete(url).json()["choices"][0]["text"]


def test_process_pair_serves_and_survives_a_completion_restart(normal_text: str, tmp_path: Path) -> None:
    store = ["--kv-store-path", str(tmp_path / "kv")]
    cport, pport = _port(), _port()
    peer = f"http://127.0.0.1:{cport}"
    with _serve(pport, "--engine-type", "prompt", "--pd-peer", peer, *store):
        url = f"http://127.0.0.1:{pport}"
        with _serve(cport, "--engine-type", "completion", *store) as completion:
            r = _complete(url)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == normal_text
            # the prompt process wrote the full prompt pages; the completion process read them from disk
            c_metrics, p_metrics = scrape(peer), scrape(url)
            assert c_metrics['dsgraph_kvstore_hits_total{tier="disk"}'] == 3
            assert c_metrics['dsgraph_pd_handoffs_total{result="admitted"}'] == 1
            assert p_metrics['dsgraph_kvstore_bytes_written_total{tier="disk"}'] > 0
            assert p_metrics['dsgraph_pd_handoffs_total{result="exported"}'] == 1
            # a long request: the completion server dies after its first tokens
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 80, "temperature": 0, "ignore_eos": True}
            with httpx.stream(
                "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60
            ) as s:
                lines = s.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                assert json.loads(first[6:])["choices"][0]["text"]
                os.killpg(completion.pid, signal.SIGKILL)
                rest = [line for line in lines if line.startswith("data: ")]
            assert s.status_code == 200 and any(
                '"error"' in line and "handoff failed" in line for line in rest
            )
        down = _complete(url)  # nobody at the peer's address: an error status naming the stage
        assert down.status_code >= 500 and "completion server" in down.json()["error"]["message"]
        assert list((tmp_path / "kv" / "blocks").glob("*/*.blk"))  # the prompt engine wrote through
        with _serve(cport, "--engine-type", "completion", *store):
            again = _complete(url)
            assert again.status_code == 200 and again.json()["choices"][0]["text"] == normal_text
