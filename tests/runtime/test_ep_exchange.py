"""dispatch -> experts -> combine on a gloo group of 2 and 4 processes equals one rank's moe_experts bit
for bit, over random routings and placements (ranks that receive nothing included); an EPLB weight move
puts every expert where the new placement says and sends only the slots whose expert a rank lacked."""

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
from tests.runtime.ep_cases import experts_params, identity_case, moe_case, move_case

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
@given(data=st.data(), gemm=st.sampled_from(["f32", "bf16"]), capacity=st.sampled_from([0, 1, 2, 12]))
def test_group_moe_equals_one_rank(group: RankGroup, data: st.DataObject, gemm: str, capacity: int) -> None:
    """Exact rows (capacity 0) or a fixed capacity per rank pair: padded to ep * capacity rows when every
    pair fits (12 always does: 4 tokens x 3 slots), the dynamic exchange when one does not."""
    ep = len(group.ranks)
    c = data.draw(cases(ep))
    physical = tuple(t[list(c["placement"].phys_to_logical)] for t in c["experts"])
    args = [(x, ids, w, c["placement"], physical, gemm, capacity) for x, ids, w in c["ranks"]]
    got = group.call(moe_case, args)
    need = max_pair_count(c["placement"], [ids for _, ids, _ in c["ranks"]])
    for (x, ids, w), (out, rows, overflows) in zip(c["ranks"], got, strict=True):
        want = rules_moe.moe_experts(experts_params(gemm), x, ids, w, *c["experts"])
        assert torch.equal(out, want)
        assert overflows == (0 < capacity < need)
        if capacity >= need:
            assert rows == ep * capacity  # static: the routing does not change the shape


def max_pair_count(p: Placement, routings: list[torch.Tensor]) -> int:
    """The most pairs one rank sends to one rank (the routing rule: copy token % copies of an expert)."""
    table, copies = (torch.from_numpy(a) for a in p.table())
    worst = 0
    for ids in routings:
        flat = ids.reshape(-1).long()
        tokens = torch.arange(ids.shape[0]).repeat_interleave(ids.shape[1])
        dest = table[flat, tokens % copies[flat]] // p.slots_per_rank
        worst = max([worst, *torch.bincount(dest, minlength=p.ep).tolist()])
    return worst


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


def changed_slots(old: Placement, new: Placement, rank: int) -> int:
    """New slots of `rank` whose expert none of its old slots held: what must come over the wire."""
    return sum(e not in old.local(rank) for e in new.local(rank))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_weight_move_sends_only_the_changed_slots(group: RankGroup, data: st.DataObject) -> None:
    ep = len(group.ranks)
    num = data.draw(st.integers(1, 5))
    slots = data.draw(st.integers(-(-num // ep), -(-num // ep) + 2)) * ep

    def placement() -> Placement:
        extra = [data.draw(st.integers(0, num - 1)) for _ in range(slots - num)]
        return Placement(num, ep, tuple(data.draw(st.permutations(list(range(num)) + extra))))

    old, new = placement(), placement()
    physical = torch.randn(num, 3, 2).to(torch.bfloat16)  # one row per logical expert
    got = group.call(move_case, [(old, new, physical)] * ep)
    row = physical[0].numel() * physical.element_size()
    for rank, (rows, received) in enumerate(got):
        assert torch.equal(rows, physical[list(new.local(rank))])
        assert received == changed_slots(old, new, rank) * row
