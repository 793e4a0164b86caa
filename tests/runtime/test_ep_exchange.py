"""dispatch -> experts -> combine on a gloo group of 2 and 4 processes equals one rank's moe_experts bit
for bit, over random routings and placements (ranks that receive nothing included)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgraph.platform.cpu import rules_moe
from dsgraph.runtime.distributed.group import Rendezvous
from dsgraph.runtime.distributed.launch import RankGroup
from dsgraph.runtime.distributed.placement import Placement
from tests.runtime.ep_cases import experts_params, identity_case, moe_case

H, INTER = 8, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", params=[2, 4])
def group(request: pytest.FixtureRequest) -> Iterator[RankGroup]:
    g = RankGroup(request.param, Rendezvous(master_port=free_port()), timeout_s=60.0)
    yield g
    g.close()


@st.composite
def cases(draw: st.DrawFn, ep: int) -> dict:
    k = draw(st.integers(1, 3))
    num = draw(st.integers(k, 6))
    slots = draw(st.integers(-(-num // ep), -(-num // ep) + 2)) * ep  # every expert placed, some copied
    extra = [draw(st.integers(0, num - 1)) for _ in range(slots - num)]
    phys = draw(st.permutations(list(range(num)) + extra))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    ranks = []
    for _ in range(ep):
        t = draw(st.integers(0, 4))
        ids = torch.stack([torch.randperm(num, generator=gen)[:k] for _ in range(t)] or [torch.zeros(0, k)])
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16)
        ranks.append((x, ids.reshape(t, k).to(torch.int32), torch.rand(t, k, generator=gen)))
    experts = (
        torch.randn(num, INTER, H, generator=gen),
        torch.randn(num, INTER, H, generator=gen),
        torch.randn(num, H, INTER, generator=gen),
    )
    return dict(placement=Placement(num, ep, tuple(phys)), ranks=ranks, experts=experts, k=k)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), gemm=st.sampled_from(["f32", "bf16"]))
def test_group_moe_equals_one_rank(group: RankGroup, data: st.DataObject, gemm: str) -> None:
    c = data.draw(cases(len(group.ranks)))
    physical = tuple(t[list(c["placement"].phys_to_logical)] for t in c["experts"])
    args = [(x, ids, w, c["placement"], physical, gemm) for x, ids, w in c["ranks"]]
    got = group.call(moe_case, args)
    for (x, ids, w), out in zip(c["ranks"], got, strict=True):
        want = rules_moe.moe_experts(experts_params(gemm), x, ids, w, *c["experts"])
        assert torch.equal(out, want)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_dispatch_then_combine_is_the_identity(group: RankGroup, data: st.DataObject) -> None:
    """k = 1: each token's row goes to one rank and comes back unchanged; every rank receives exactly the
    pairs of its own experts (some receive none)."""
    ep = len(group.ranks)
    c = data.draw(cases(ep).filter(lambda c: c["k"] == 1))
    p = c["placement"]
    got = group.call(identity_case, [(x, ids, p) for x, ids, _ in c["ranks"]])
    table, copies = (torch.from_numpy(a) for a in p.table())
    expected_rows = [0] * ep
    for _, ids, _ in c["ranks"]:
        flat = ids.reshape(-1).long()
        phys = table[flat, torch.arange(len(flat)) % copies[flat]]
        for r in (phys // p.slots_per_rank).tolist():
            expected_rows[r] += 1
    for rank, ((x, _, _), (back, rows, local)) in enumerate(zip(c["ranks"], got, strict=True)):
        assert torch.equal(back, x.float())
        assert rows == expected_rows[rank]
        assert all(0 <= s < p.slots_per_rank for s in local)
