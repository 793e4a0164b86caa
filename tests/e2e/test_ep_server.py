"""`dsgraph serve --ep 2` in-process: one API process, two rank processes (gloo, loopback). Concurrent
chat completions equal the single-process server's; /metrics has the EPLB imbalance; a killed rank ends
the group: the next request gets 503 and /health names the rank, within a bounded time."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from typing import Any

import httpx2 as httpx
import pytest

from dsgraph.runtime.distributed.config import EPConfig
from dsgraph.runtime.distributed.front import GroupEngine
from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import scrape, serving

MODEL = "tiny-test"
CONFIG = EngineConfig.from_flat(max_model_len=128, max_num_seqs=4)
BODIES = [
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"W{i} W{i + 2} w{i + 5}"}],
        "max_tokens": 5 + i % 3,
        "temperature": 0 if i % 2 else 0.9,
        "seed": 40 + i,
    }
    for i in range(6)
]


def contents(url: str) -> list[Any]:
    def one(body: dict[str, Any]) -> Any:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"], r.json()["usage"]["completion_tokens"]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        return list(pool.map(one, BODIES))


@pytest.mark.slow
# the server's engine thread ends with the RankError by design (it is what /health reports)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_group_server_equals_one_process_then_a_dead_rank_gives_503() -> None:
    root = default_model_dir()
    with serving(create_app(Engine(root, CONFIG), MODEL, recipe_tokenizer(root))) as url:
        want = contents(url)
    engine = GroupEngine(root, CONFIG, EPConfig(ep=2, extra_experts=1, timeout_s=20))
    try:
        with serving(create_app(engine, MODEL, recipe_tokenizer(root))) as url:
            assert contents(url) == want
            assert scrape(url)["dsgraph_eplb_imbalance"] >= 1.0
            os.kill(engine.group.procs[1].pid, signal.SIGKILL)
            start = time.monotonic()
            r = httpx.post(f"{url}/v1/chat/completions", json=BODIES[0], timeout=60)
            assert r.status_code == 503 and "rank 1" in r.text, r.text
            deadline = time.monotonic() + 30
            while (h := httpx.get(f"{url}/health")).status_code != 503:
                assert time.monotonic() < deadline, h.text
                time.sleep(0.1)
            assert "rank 1" in h.text and "killed by signal 9" in h.text
            assert time.monotonic() - start < 30
    finally:
        engine.close()
