"""EPLB placement against brute force on small cases, DeepInfer's redundant-expert rounding, and the
errors of bad EP options."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgraph.runtime.distributed import eplb
from dsgraph.runtime.distributed.config import EPConfig, check_ep, num_redundant
from dsgraph.runtime.distributed.group import Rendezvous, from_env
from dsgraph.runtime.distributed.placement import Placement, initial


def brute_pack(weights: list[float], ep: int, slots: int) -> float:
    best = float("inf")
    for where in itertools.product(range(ep), repeat=len(weights)):
        if max(where.count(r) for r in range(ep)) > slots:
            continue
        sums = [sum(w for w, r in zip(weights, where, strict=True) if r == q) for q in range(ep)]
        best = min(best, max(sums))
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 3), st.integers(1, 3), st.data())
def test_pack_is_optimal(ep: int, slots: int, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, ep * slots))
    weights = sorted(data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), reverse=True)
    where = eplb.pack([float(w) for w in weights], ep, slots)
    assert all(where.count(r) <= slots for r in range(ep))
    sums = [sum(w for w, r in zip(weights, where, strict=True) if r == q) for q in range(ep)]
    assert max(sums) == brute_pack(weights, ep, slots)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=4), st.integers(0, 3))
def test_replicate_minimises_the_largest_replica_load(loads: list[int], extra: int) -> None:
    counts = eplb.replicate(np.array(loads), len(loads) + extra)
    assert counts.sum() == len(loads) + extra and counts.min() >= 1
    got = max(load / c for load, c in zip(loads, counts, strict=True))
    best = min(
        max(load / c for load, c in zip(loads, cs, strict=True))
        for cs in itertools.product(range(1, extra + 2), repeat=len(loads))
        if sum(cs) == len(loads) + extra
    )
    assert got == best


def test_rebalance_beats_the_initial_layout_and_keeps_every_expert() -> None:
    loads = np.array([900, 10, 10, 10, 10, 10, 10, 40])
    p = initial(8, 4, 4)
    new = eplb.rebalance(p, loads)
    assert sorted(set(new.phys_to_logical)) == list(range(8)) and len(new.phys_to_logical) == 12
    assert eplb.imbalance(new, loads) < eplb.imbalance(p, loads)
    assert new.phys_to_logical.count(0) == 5  # the hot expert takes every redundant slot


def test_initial_layout_is_routed_then_copies() -> None:
    p = initial(4, 4, 2)
    assert p.phys_to_logical == (0, 1, 2, 3, 0, 1, 2, 3)
    assert p.local(1) == (0, 1, 2, 3)


@pytest.mark.parametrize(
    ("routed", "ep", "minimum", "extra"),
    [(384, 4, 32, 32), (384, 64, 32, 64), (384, 128, 32, 128), (384, 5, 32, 36), (8, 1, 32, 0), (4, 3, 0, 2)],
)
def test_redundant_experts_round_up_to_the_ep_size(routed: int, ep: int, minimum: int, extra: int) -> None:
    assert num_redundant(routed, ep, minimum) == extra
    check_ep(ep, routed, extra, "experts")


def test_bad_ep_options_name_the_option_and_the_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"--ep 3 does not divide the 8 experts.*allowed: \[1, 2, 4, 8\]"):
        check_ep(3, 8, 0, "experts")
    with pytest.raises(ValueError, match=r"--ep is 0, expected an integer >= 1"):
        EPConfig(ep=0)
    with pytest.raises(ValueError, match=r"eplb interval is 5, expected 0 \(never\) or >= the window \(10\)"):
        EPConfig(ep=2, window=10, interval=5)
    with pytest.raises(ValueError, match=r"torchrun rendezvous: \['MASTER_PORT'\] not set"):
        from_env({"MASTER_ADDR": "h", "RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"--node-rank is 2, expected 0..1 \(--nnodes 2\)"):
        Rendezvous(nnodes=2, node_rank=2)
    with pytest.raises(ValueError, match=r"--ep 3 does not split over --nnodes 2"):
        Rendezvous(master_port=1, nnodes=2).ranks_here(3)
    with pytest.raises(ValueError, match="every one of the 3 experts needs a replica"):
        Placement(3, 2, (0, 1, 1, 0))


def test_a_free_port_needs_one_node() -> None:
    with pytest.raises(ValueError, match=r"--master-port is 0, expected 1..65535 \(--nnodes 2\)"):
        Rendezvous(nnodes=2)
    assert Rendezvous().resolved().master_port > 0
