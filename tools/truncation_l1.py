"""L1 equivalence check of prefill truncation: step metadata only, no weights, seconds.

The real C++ scheduler plans a workload (requests of different lengths, chunked prefill, decode rows of
earlier requests in the same steps, an exempt request asking for prompt log-probabilities); every plan
is turned into the step inputs of each mode (off, mask, compact) by the engine's own code
(`runtime/prefill_truncation.py`). From those inputs this module derives, from the ops' documented
contracts (not from their rules), what every layer group reads and writes:

- SWA pivots of every row: the lowest visible position `max(0, window start, p - window + 1)` and the
  chunk start above which keys come from this step's rows;
- the visible keys, expanded to positions with their source (a row of this step, or a ring entry);
- the SWA ring store slots (slot * R + p % R for the chunk's last R positions);
- the compressed key ranges (visible entries `(p + 1) // ratio` per row; entries the KV source writes).

A simulated ring (which request's position each entry holds) checks that every key a row reads from the
ring was written by a decoder row of that request at that position. The checks: the encoder's metadata
(every row; the boundary's compressed-KV writes use it in every mode) is that of off; a kept row's
decoder metadata is the same in mask and compact and is the rectangle
`max(p - window + 1, window start, keep_start)..p`; a truncated row of mask sees no key; compact runs
no truncated row; decode rows after the prompt read what they read with truncation off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from dsgraph.runtime.prefill_truncation import MODES, PrefillTruncation
from dsgraph.runtime.scheduler import Scheduler, SchedulerConfig, model_inputs

__all__ = ["L1Config", "L1Report", "row_metadata", "run_l1"]


@dataclass(frozen=True)
class L1Config:
    window: int = 8
    ring_len: int = 14  # window + ROLLBACK_ROOM
    keep: int = 14
    prompts: tuple[int, ...] = (40, 23, 57, 9, 31)  # prompt lengths; request 1 asks for prompt logprobs
    exempt: tuple[int, ...] = (1,)
    budget: int = 24  # max_num_batched_tokens: chunked prefill mixed with decode rows
    decode_steps: int = 12
    page_size: int = 16
    max_model_len: int = 512
    # prefix caching with a replay of `replay` tokens (all prompts share their tokens, so later requests
    # hit earlier ones: their chunks start at a replay start with seq_window_start > 0); None: caching off
    replay: int | None = None


@dataclass
class L1Report:
    steps: int = 0
    rows: dict[str, int] = field(default_factory=dict)  # mode -> decoder rows run
    truncated_steps: int = 0
    replayed_seqs: int = 0  # sequences planned after a prefix hit (seq_window_start > 0)
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.truncated_steps > 0

    def as_text(self) -> str:
        lines = [
            f"L1 prefill truncation: {self.steps} steps, {self.truncated_steps} truncated, "
            f"{self.replayed_seqs} sequences after a prefix hit; decoder rows "
            + ", ".join(f"{m} {n}" for m, n in self.rows.items()),
            "OK" if self.ok else f"FAILED: {len(self.mismatches)} mismatches",
        ]
        return "\n".join(lines + self.mismatches[:20]) + "\n"


Key = tuple[int, int]  # (request id, position)


def row_metadata(
    inputs: Mapping[str, np.ndarray], rids: Sequence[int], window: int, ring_len: int, decoder: bool
) -> dict[Key, dict[str, Any]]:
    """Per real row of the encoder (`decoder` False) or decoder view of a step: its pivots, visible keys
    (position, "chunk" | "ring") and ring store slot (-1: not stored), keyed by (request, position)."""
    if decoder and "kept_rows" in inputs:
        positions, seq_ids = inputs["kept_positions"], inputs["kept_seq_ids"]
        seq_start = inputs["seq_decoder_start"]
    else:
        positions, seq_ids, seq_start = inputs["positions"], inputs["seq_ids"], inputs["seq_start"]
    narrowed = decoder and "seq_decoder_window_start" in inputs
    first = inputs["seq_decoder_window_start"] if narrowed else inputs["seq_window_start"]
    table = inputs["block_table_r1"]
    out: dict[Key, dict[str, Any]] = {}
    for t, (p, s) in enumerate(zip(positions.tolist(), seq_ids.tolist(), strict=True)):
        if s < 0:
            continue
        lo = max(0, int(first[s]), p - window + 1)
        start = int(seq_start[s])
        keys = []
        for pos in range(lo, p + 1):
            if pos >= start:
                row = t - (p - pos)
                if row < 0 or int(positions[row]) != pos or int(seq_ids[row]) != s:
                    keys.append((pos, "bad-row"))
                    continue
                keys.append((pos, "chunk"))
            else:
                keys.append((pos, "ring"))
        end = int(inputs["seq_end"][s])
        slot = int(inputs["seq_slot"][s]) * ring_len + p % ring_len if p >= end - ring_len else -1
        # ratio-1 compressed range: entries 0 .. p visible, read through the sequence's block table
        ranges = (p + 1, tuple(table[s].tolist()))
        out[(int(rids[s]), p)] = {"lo": lo, "start": start, "keys": keys, "slot": slot, "ranges": ranges}
    return out


class _Ring:
    """Which (request, position) each decoder ring entry holds, as written by the decoder rows."""

    def __init__(self) -> None:
        self.held: dict[int, Key] = {}

    def check_reads(
        self, meta: Mapping[Key, dict[str, Any]], slots: Mapping[int, int], ring_len: int
    ) -> list:
        bad = []
        for (rid, p), m in meta.items():
            for pos, source in m["keys"]:
                if source == "bad-row":
                    bad.append(f"row ({rid}, {p}) reads position {pos} from a row that does not hold it")
                elif source == "ring" and self.held.get(slots[rid] * ring_len + pos % ring_len) != (rid, pos):
                    got = self.held.get(slots[rid] * ring_len + pos % ring_len)
                    bad.append(f"row ({rid}, {p}) reads ring position {pos}, which holds {got}")
        return bad

    def write(self, meta: Mapping[Key, dict[str, Any]]) -> None:
        for key, m in meta.items():
            if m["slot"] >= 0:
                self.held[m["slot"]] = key


def _lives(cfg: L1Config, tokens: Mapping[int, list[int]]) -> dict[int, Any]:
    return {
        rid: SimpleNamespace(
            prompt=[3] * n,
            tokens=tokens[rid],
            params=SimpleNamespace(prompt_logprobs=1 if rid in cfg.exempt else None, golden_token_ids=()),
        )
        for rid, n in enumerate(cfg.prompts)
    }


def _scheduler(cfg: L1Config) -> Scheduler:
    pages = len(cfg.prompts) * (-(-cfg.max_model_len // cfg.page_size))
    s = Scheduler(
        SchedulerConfig(
            max_num_seqs=len(cfg.prompts),
            max_num_batched_tokens=cfg.budget,
            max_model_len=cfg.max_model_len,
            page_size=cfg.page_size,
            num_pages=(pages, pages),
            enable_prefix_cache=cfg.replay is not None,
            replay_tokens=cfg.replay or 0,
        )
    )
    for rid, n in enumerate(cfg.prompts):
        s.add_request(rid, [3] * n, max_tokens=cfg.decode_steps, ignore_eos=True)
    return s


def _compare(
    cfg: L1Config, metas: dict[str, dict[str, Any]], lives: Mapping[int, Any], prefill: set[int]
) -> list[str]:
    """The mode-to-mode checks of one step (`metas[mode]` = {"enc": ..., "dec": ...}); `prefill`: the
    requests of its prefill chunks (decode rows are never truncated: their rectangle starts at 0)."""
    bad = []
    off, mask, compact = metas["off"], metas["mask"], metas["compact"]
    for mode in ("mask", "compact"):
        if metas[mode]["enc"] != off["enc"]:
            bad.append(f"{mode}: the encoder's metadata differs from off")
    keep_start = {
        rid: max(len(lv.prompt) + len(lv.tokens) - cfg.keep, 0)
        if rid in prefill and rid not in cfg.exempt
        else 0
        for rid, lv in lives.items()
    }
    for key, m in mask["dec"].items():
        rid, p = key
        if p >= keep_start[rid]:
            if key not in compact["dec"]:
                bad.append(f"compact: kept row {key} is missing")
                continue
            c = compact["dec"][key]
            if [k for k, _ in c["keys"]] != [k for k, _ in m["keys"]] or c["slot"] != m["slot"]:
                bad.append(f"kept row {key}: mask reads {m['keys']} slot {m['slot']}, compact {c}")
            # the encoder's window (it starts at a prefix hit's replay start) cut to the kept suffix
            want = list(range(max(off["enc"][key]["lo"], keep_start[rid]), p + 1))
            if [k for k, _ in m["keys"]] != want:
                bad.append(f"kept row {key}: visible {[k for k, _ in m['keys']]}, the rectangle is {want}")
            if m["ranges"] != off["dec"][key]["ranges"] or c["ranges"] != m["ranges"]:
                bad.append(f"kept row {key}: compressed key range differs between modes")
        else:
            if m["keys"]:
                bad.append(f"mask: truncated row {key} sees keys {m['keys']}")
            if key in compact["dec"]:
                bad.append(f"compact: truncated row {key} runs in the decoder")
    return bad


def run_l1(cfg: L1Config = L1Config(), policy_keep: int | None = None) -> L1Report:
    """Plan the workload once with the real scheduler and check every step in the three modes.
    `policy_keep` overrides the kept tokens the step inputs are built with (to show a bad KEEP fails)."""
    report = L1Report(rows={m: 0 for m in MODES})
    sched = _scheduler(cfg)
    tokens: dict[int, list[int]] = {rid: [] for rid in range(len(cfg.prompts))}
    rings = {m: _Ring() for m in MODES}
    keep = cfg.keep if policy_keep is None else policy_keep
    policies = {m: PrefillTruncation(m, keep, cfg.window) for m in ("mask", "compact")}
    plan = sched.schedule()
    while plan.bucket > 0:
        report.steps += 1
        lives = _lives(cfg, tokens)
        base = {k: np.asarray(v) for k, v in model_inputs(plan).items()}
        rids = [int(r) for r in plan.seq_rids[: plan.num_seqs]]
        slots = {rid: int(base["seq_slot"][s]) for s, rid in enumerate(rids)}
        step = {"off": base, **{m: p.apply(plan, dict(base), lives) for m, p in policies.items()}}
        report.truncated_steps += "seq_decoder_window_start" in step["compact"]
        report.replayed_seqs += int((base["seq_window_start"] > 0).sum())
        metas = {}
        for mode, inputs in step.items():
            enc = row_metadata(inputs, rids, cfg.window, cfg.ring_len, decoder=False)
            dec = row_metadata(inputs, rids, cfg.window, cfg.ring_len, decoder=True)
            reads = rings[mode].check_reads(dec, slots, cfg.ring_len)
            report.mismatches += [f"step {plan.step} {mode}: {b}" for b in reads]
            rings[mode].write(dec)
            report.rows[mode] += len(dec)
            metas[mode] = {"enc": enc, "dec": dec}
        prefill = set(rids[plan.num_decode :])
        report.mismatches += [f"step {plan.step}: {b}" for b in _compare(cfg, metas, lives, prefill)]
        sampled = np.full(len(plan.sample_rows), 4, dtype=np.int32)
        for rid in plan.sample_rids.tolist():
            tokens[int(rid)].append(4)
        _, plan = sched.advance(sampled)
    return report
