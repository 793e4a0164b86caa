"""Prefill truncation on the host: which rows of a step the decoder layers run on, and the start-up rule.

With `EngineConfig.truncation.mode` "mask" or "compact", the decoder layers of a prompt run only on
its last `keep` tokens (models/deepseek_v41/truncation.py has the graph side). Per sequence of a step
the kept suffix starts at `keep_start = target_len - keep`, where `target_len` is the number of tokens
the request holds once this prefill is done (prompt, plus outputs when a preempted request recomputes).
Rows below it are truncated. A step with no truncated row runs the plain graph, so decode steps, short
prompts and exempt requests cost nothing and give exactly what truncation "off" gives.

Exempt requests (run untruncated, exact values): those asking for prompt log-probabilities (every
prompt row's logits are returned) and teacher-forced ones (`golden_token_ids`: scoring runs that must not
be approximations).

The rule on `keep` (DeepInfer's): the first decode step reads the last `sliding_window` keys of every
decoder layer, and a verify step may write and roll back `maximum backtrack` = drafts + 1 positions, so
the kept suffix must cover window + backtrack positions (128 + 6 = 134 for V4.1 with 5 drafts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsgraph.models.interface import ROLLBACK_ROOM
from dsgraph.models.interface import TRUNCATION_MODES as MODES
from dsgraph.runtime.engine_config import TruncationConfig

__all__ = [
    "MODES",
    "PrefillTruncation",
    "max_backtrack",
    "min_keep_tokens",
    "truncated_inputs",
]

LOG = logging.getLogger("dsgraph.engine")
# The stated bounds of truncation against off (tests/unit/test_truncation_l2.py, KEEP = the minimum, on
# the tiny random checkpoints in both numerics, where the measured maxima are 0.053 nats for a
# teacher-forced token's log-probability, 0.15 over whole log-prob rows and 0.24 for a DSpark
# confidence). The README and the engine's start-up log quote them.
BOUND_NATS = 0.2
BOUND_LOGPROB_ROW = 0.5
BOUND_CONFIDENCE = 0.4


def max_backtrack(text: Any, draft_len: int | None = None) -> int:
    """Positions a verify step may write and roll back: the anchor plus the drafts (`draft_len`, default
    the checkpoint's DSpark block size capped by the rings' rollback room; 0 without DSpark stages)."""
    if draft_len is None:
        has_stages = text.num_nextn_predict_layers > 0
        draft_len = min(text.dspark_block_size, ROLLBACK_ROOM - 1) if has_stages else 0
    return draft_len + 1


def min_keep_tokens(text: Any, draft_len: int | None = None) -> int:
    return text.sliding_window + max_backtrack(text, draft_len)


def resolve_keep(text: Any, keep: int | None, draft_len: int | None = None) -> int:
    """`keep` checked against the model (None: the minimum); the error names both numbers."""
    window, back = text.sliding_window, max_backtrack(text, draft_len)
    if keep is None:
        return window + back
    if keep < window + back:
        raise ValueError(
            f"EngineConfig.truncation.keep_tokens = {keep} is below sliding_window ({window}) + maximum "
            f"backtrack ({back}) = {window + back}; the decoder layers' window state after a truncated "
            "prefill needs that many"
        )
    return keep


def truncated_inputs(
    inputs: Mapping[str, np.ndarray], keep_start: np.ndarray, mode: str, window: int
) -> dict[str, np.ndarray] | None:
    """The step inputs of a truncated step (`keep_start` [seqs]: first kept position per sequence, 0 for
    an untruncated one), or None when no row's decoder window reaches below its kept suffix (then the
    step runs the plain graph). A chunk of kept rows only still needs the narrowed window while its
    first rows' windows (`window` positions) reach back past the suffix's start."""
    seq_ids = np.asarray(inputs["seq_ids"])
    positions = np.asarray(inputs["positions"])
    keep_start = np.asarray(keep_start, dtype=np.int32)
    real = seq_ids >= 0
    seq = np.clip(seq_ids, 0, None)
    row_start = np.where(real, keep_start[seq] if keep_start.size else 0, 0)
    lowest = np.maximum(positions - window + 1, 0)
    if keep_start.size:
        lowest = np.maximum(lowest, np.asarray(inputs["seq_window_start"])[seq])
    if not (real & (lowest < row_start)).any():
        return None
    kept = real & (positions >= row_start)
    out = dict(inputs)
    out["seq_decoder_window_start"] = np.maximum(np.asarray(inputs["seq_window_start"]), keep_start)
    if mode == "mask":
        return out
    rows = np.flatnonzero(kept).astype(np.int32)
    index = np.full(seq_ids.shape[0], -1, dtype=np.int32)
    index[rows] = np.arange(rows.shape[0], dtype=np.int32)
    sample = np.asarray(inputs["sample_rows"])
    lost = sample[index[sample] < 0]
    if lost.size:
        raise ValueError(f"prefill truncation: sample row {int(lost[0])} is a truncated row")
    starts = np.maximum(np.asarray(inputs["seq_start"]), keep_start)
    out.update(
        kept_rows=rows,
        kept_positions=positions[rows].astype(np.int32),
        kept_seq_ids=seq_ids[rows].astype(np.int32),
        seq_decoder_start=np.minimum(starts, np.asarray(inputs["seq_end"])).astype(np.int32),
        sample_rows=index[sample],
    )
    return out


@dataclass(frozen=True)
class PrefillTruncation:
    """An engine's truncation policy: the mode and the checked number of kept tokens."""

    mode: str
    keep: int
    window: int  # the config's sliding_window

    @classmethod
    def for_engine(cls, text: Any, config: TruncationConfig, draft_len: int | None) -> Any:
        """The policy, or None for "off"; logs that it is an approximation and its measured bound."""
        mode = config.mode
        if mode == "off":
            return None
        policy = cls(mode, resolve_keep(text, config.keep_tokens, draft_len), text.sliding_window)
        LOG.warning(
            "prefill truncation %s: the decoder layers (from layer %d) run on each prompt's last %d tokens "
            "only. This is an approximation: their sliding-window state differs from a full prefill "
            "(global caches stay exact); on the tiny random checkpoints a teacher-forced token's "
            "log-prob moves by at most %.2f nats (measured 0.053; unmeasured on real weights). "
            "Prompt-logprob and teacher-forced requests run untruncated.",
            mode,
            max(text.kv_source_layer_ids),
            policy.keep,
            BOUND_NATS,
        )
        return policy

    def keep_starts(self, target_len: np.ndarray, exempt: np.ndarray) -> np.ndarray:
        return np.where(exempt, 0, np.maximum(np.asarray(target_len) - self.keep, 0)).astype(np.int32)

    def apply(
        self, plan: Any, inputs: dict[str, np.ndarray], live: Mapping[int, Any]
    ) -> dict[str, np.ndarray]:
        """`inputs` of an engine step, truncated where a prefill chunk lies before its kept suffix.
        `live`: request id -> the engine's record (prompt, tokens, params)."""
        n = plan.num_seqs
        if plan.num_decode == n:
            return inputs
        target = np.zeros(n, dtype=np.int64)
        exempt = np.ones(n, dtype=bool)
        for k in range(plan.num_decode, n):
            lv = live.get(int(plan.seq_rids[k]))
            if lv is None:  # released while in the plan: its rows are discarded anyway
                continue
            p = lv.params
            target[k] = len(lv.prompt) + len(lv.tokens)
            exempt[k] = p.prompt_logprobs is not None or bool(p.golden_token_ids)
        out = truncated_inputs(inputs, self.keep_starts(target, exempt), self.mode, self.window)
        return inputs if out is None else out
