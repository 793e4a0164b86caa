"""Expert parallelism end to end (cpu, gloo, loopback): LLM(ep=2 | 4) runs data-parallel attention over
that many rank processes with the experts partitioned (plus redundant copies) and produces the tokens
(greedy and seeded) and prompt log-probabilities of the single-process engine bit for bit, with DSpark
drafting and prefix caching on, with the exchange's exact rows or a fixed capacity; an EPLB rebalance in
the middle of generation changes nothing and sends only the changed slots; each node keeps one copy of
the Engram tables."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dsgraph.runtime.distributed.config import EPConfig
from dsgraph.runtime.distributed.launch import RankError
from dsgraph.runtime.llm import LLM
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.tools.cli import main
from tests.oracle import model_fixtures as fx
from tests.runtime.ep_cases import die_after, engram_pages, layout, load_stats, moved, rebalance_history
from tests.runtime.test_ep_exchange import changed_slots
from tests.runtime.test_spec_engine import CURVE

SHARED = fx.prompt(500, 20)  # a prefix several prompts share: prefix cache hits
PROMPTS = [SHARED + fx.prompt(600 + i, 1 + i) for i in range(4)] + [
    fx.prompt(700 + i, 5 + 3 * i) for i in range(3)
]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.8, seed=12, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
    # prompts of their own (no cache hit in any run): every prompt position has a logprob
    SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=0),
    SamplingParams(temperature=1.0, seed=13, max_tokens=6, ignore_eos=True, prompt_logprobs=0),
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2),
]
CONFIG: dict[str, Any] = dict(
    max_model_len=64,
    speculative="dspark",
    deterministic=True,
    throughput_curve=CURVE,
    prefix_replay="exact",  # a cache hit gives the tokens of a cold prefill: hits may differ by rank
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))


def summary(outs: list[Any]) -> list[tuple[Any, ...]]:
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs, o.error) for o in outs]


@pytest.fixture(scope="module")
def reference(model_dir) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    return summary(LLM(model_dir, **CONFIG).generate(PROMPTS, PARAMS))


def run_ep(model_dir: str, ep: EPConfig) -> tuple[list[tuple[Any, ...]], list[dict[str, float]]]:
    llm = LLM(model_dir, ep=ep, **CONFIG)
    try:
        outs = summary(llm.generate(PROMPTS, PARAMS))
        for shapes in llm.group.call(layout):  # each rank holds its share of every MoE's slots
            assert shapes and all(rows * ep.ep == slots for rows, slots in shapes.values())
        check_one_engram_copy(llm)
        stats = llm.group.call(load_stats)
        for s, m, h in zip(stats, llm.group.call(moved), llm.group.call(rebalance_history), strict=True):
            s["moved"], s["history"] = m, h
        return outs, stats
    finally:
        llm.group.close()


def check_one_engram_copy(llm: LLM) -> None:
    """Every rank's Engram tables lie in one shared file mapping of the node (same device and inode), and
    once every rank read them all their resident pages are shared: one copy in memory, not one per rank."""
    llm.group.call(engram_pages, True)
    pages = llm.group.call(engram_pages, False)
    assert pages[0] and all(p.keys() == pages[0].keys() for p in pages)
    for name in pages[0]:
        maps = [p[name] for p in pages]
        assert len({(dev, inode) for dev, inode, *_ in maps}) == 1 and maps[0][1] != 0, maps
        assert all("dsgraph-ep-" in path and rss > 0 and shared == rss for _, _, path, rss, shared in maps), (
            maps
        )


@pytest.mark.slow
@pytest.mark.parametrize("ep", [2, 4])
def test_ep_equals_one_process(model_dir, reference, ep: int) -> None:  # type: ignore[no-untyped-def]
    # EP2 with a fixed exchange capacity: decode layers padded, prefills past it take the exact path
    capacity = 8 if ep == 2 else 0
    got, stats = run_ep(
        model_dir, EPConfig(ep=ep, extra_experts=1, interval=0, timeout_s=300, capacity=capacity)
    )
    assert got == reference
    assert all(s["rebalances"] == 0 for s in stats)
    if capacity:
        assert all(s["capacity_padded"] > 0 and s["capacity_overflows"] > 0 for s in stats), stats
    assert reference[4][2] is not None and all(v is not None for v in reference[4][2][1:])


@pytest.mark.slow
def test_rebalance_mid_generation_changes_nothing(model_dir, reference) -> None:  # type: ignore[no-untyped-def]
    ep = EPConfig(ep=2, extra_experts=2, window=2, interval=4, timeout_s=300)
    got, stats = run_ep(model_dir, ep)
    assert got == reference
    assert all(s["rebalances"] >= 2 and s["moved"] for s in stats)
    assert all(s["imbalance"] >= 1.0 for s in stats)
    for rank, s in enumerate(stats):  # the wire carried the changed slots' rows, nothing else
        history, per_slot, received = s["history"]
        assert history and received == s["moved_bytes"]
        assert received == sum(changed_slots(old, new, rank) * per_slot[m] for m, old, new in history)


@pytest.mark.slow
def test_a_dead_rank_ends_the_group_with_an_error_naming_it(model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model_dir, ep=EPConfig(ep=2, interval=0, timeout_s=30), **CONFIG)
    llm.group.call(die_after, 1, 3)
    start = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1: the process died \(killed by signal 9\)"):
        llm.generate(PROMPTS, PARAMS)
    assert time.monotonic() - start < 30
    assert llm.group.group.closed and not any(p.is_alive() for p in llm.group.group.procs)


@pytest.mark.slow
def test_cli_generate_ep_prints_the_single_process_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--prompt", "w1 W2", "--prompt", "w3 w4 w5", "--prompt", "W6", "--max-tokens", "4"]
    assert main(argv) == 0
    single = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith(("prompt:", "output:"))
    ]
    assert main([*argv, "--ep", "2"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith(("prompt:", "output:"))] == single
    assert "expert parallel: 2 ranks, EPLB imbalance (slowest rank / mean)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ep", "2", "--nnodes", "2"], r"--master-addr \(or \$MASTER_ADDR\) is required with --nnodes 2"),
        (
            ["--ep", "3", "--nnodes", "2", "--master-addr", "h", "--master-port", "1"],
            r"--ep 3 does not split",
        ),
        (["--ep", "0"], r"--ep is 0, expected an integer >= 1"),
        (
            ["--ep", "2", "--nnodes", "2", "--node-rank", "5", "--master-addr", "h", "--master-port", "9"],
            r"--node-rank is 5",
        ),
    ],
)
def test_cli_bad_ep_options_are_named(argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(SystemExit, match=message):
        main(["generate", "--prompt", "w1", *argv])
