"""Two "nodes" of one rank each on loopback (`--nnodes 2 --node-rank 0|1`): node 0's API process sends
requests to the ranks of both nodes, node 1's process relays them (runtime/distributed/nodes.py), and the
chat completions equal the single-process server's."""

from __future__ import annotations

import threading

import pytest

from dsgraph.runtime.distributed.config import EPConfig
from dsgraph.runtime.distributed.front import GroupEngine
from dsgraph.runtime.distributed.group import Rendezvous
from dsgraph.runtime.distributed.nodes import relay
from dsgraph.runtime.engine import Engine
from dsgraph.runtime.server.app import create_app
from dsgraph.runtime.server.protocol import recipe_tokenizer
from dsgraph.tools.generate_cmd import default_model_dir
from tests.e2e.serve_util import serving
from tests.e2e.test_ep_server import CONFIG, MODEL, contents
from tests.runtime.test_ep_exchange import free_port


def free_pair() -> int:
    """A port p with p + 1 free too (the rendezvous and node 0's request channel)."""
    while True:
        p = free_port()
        if p < 65535 and free_port_at(p + 1):
            return p


def free_port_at(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow
def test_requests_reach_the_ranks_of_both_nodes() -> None:
    root = default_model_dir()
    with serving(create_app(Engine(root, CONFIG), MODEL, recipe_tokenizer(root))) as url:
        want = contents(url)
    ep, port = EPConfig(ep=2, extra_experts=1, timeout_s=30), free_pair()
    node1: list[BaseException] = []

    def run_node1() -> None:
        rv = Rendezvous("127.0.0.1", port, 2, 1)
        try:
            engine = GroupEngine(root, CONFIG, ep, rv)
            relay(engine.group, rv, engine.usage, ep.timeout_s)
        except BaseException as exc:  # the test asserts there is none
            node1.append(exc)

    thread = threading.Thread(target=run_node1, daemon=True)
    thread.start()
    engine = GroupEngine(root, CONFIG, ep, Rendezvous("127.0.0.1", port, 2, 0))
    try:
        assert engine.ranks == [0, 1] and engine.group.ranks == [0]
        with serving(create_app(engine, MODEL, recipe_tokenizer(root))) as url:
            assert contents(url) == want
        # each rank counts the prompt tokens it looked up in its own prefix cache: both took requests
        looked_up = {r: engine.usage[r]["prefix"][0] for r in (0, 1)}
        assert all(n > 0 for n in looked_up.values()), looked_up
    finally:
        engine.close()
        thread.join(30)
    assert not thread.is_alive() and not node1, node1
