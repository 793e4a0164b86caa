"""The engine's structured-output state: which requests are constrained, their grammars (compiled off
the engine thread, runtime/structured/compiler.py), and the bitmask of each sampling step.

A constrained request is recorded at once but joins the scheduler only when its grammar is compiled
(`admit`, called from `poll` at the start of a step), so a slow compile holds up only that request. A
compile that fails or takes longer than the timeout ends the request with an error naming the field.

Steps without a constrained row build no mask at all: the sampling op then runs without one, so an
unconstrained batch is exactly what it was before. In a mixed batch the unconstrained rows get
all-allowed words, which mask nothing.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer

from dsgraph.ops.sampling import mask_words
from dsgraph.runtime.structured.compiler import CompileConfig, GrammarCache, GrammarError, result, vocabulary
from dsgraph.runtime.structured.matcher import ALL_ALLOWED, RequestGrammar
from dsgraph.runtime.structured.params import StructuredOutputsParams

__all__ = ["StructuredState"]

_POLL_S = 0.02  # how long an otherwise idle step waits for a compile to finish


@dataclass(frozen=True)
class _Pending:
    params: StructuredOutputsParams
    future: cf.Future[Any]
    admit: Callable[[], None]
    deadline: float  # time.monotonic() after which the request is refused


class StructuredState:
    """Grammars of the constrained requests of one engine (model vocabulary `vocab_size`)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        stop_token_ids: list[int],
        config: CompileConfig | None = None,
    ) -> None:
        self._tokenizer, self.vocab_size, self._stops = tokenizer, vocab_size, stop_token_ids
        self.config = config or CompileConfig()
        self._cache: GrammarCache | None = None
        self._lock = threading.Lock()
        self.grammars: dict[int, RequestGrammar] = {}
        self.pending: dict[int, _Pending] = {}

    @property
    def cache(self) -> GrammarCache:
        """Built on the first constrained request: unconstrained engines never load XGrammar."""
        with self._lock:  # the server's handlers may ask first, from their own threads
            if self._cache is None:
                info = vocabulary(self._tokenizer, self.vocab_size, self._stops)
                self._cache = GrammarCache(info, self.config)
            return self._cache

    def use_cache(self, cache: GrammarCache) -> None:
        """Share a compiled-grammar cache (its TokenizerInfo must be this model's vocabulary)."""
        if cache.info.vocab_size != self.vocab_size:
            raise ValueError(f"grammar cache: vocab_size {cache.info.vocab_size}, expected {self.vocab_size}")
        self._cache = cache

    def add(self, rid: int, params: StructuredOutputsParams, admit: Callable[[], None]) -> None:
        """Constrain request `rid`; `admit` queues it in the scheduler once its grammar is ready (now, if
        it is cached). A grammar that already failed raises GrammarError."""
        future = self.cache.submit(params)
        if future.done():
            self._start(rid, result(future, params, self.config.timeout_s))
            admit()
            return
        self.pending[rid] = _Pending(params, future, admit, time.monotonic() + self.config.timeout_s)

    def _start(self, rid: int, compiled: Any) -> None:
        grammar = RequestGrammar(compiled)
        first = self._blank(1)
        grammar.fill(first, 0)
        if not bool(first.any()):  # e.g. a word-level vocabulary that cannot spell JSON
            raise GrammarError(
                "structured_outputs", "grammar", "spellable: this tokenizer has no token it allows"
            )
        self.grammars[rid] = grammar

    def poll(self, idle: bool) -> list[tuple[int, str]]:
        """Admit the requests whose grammar is ready; returns (rid, error) of those refused. `idle`:
        nothing else can run, so wait a little for a compile instead of spinning."""
        if not self.pending:
            return []
        if idle:
            cf.wait([p.future for p in self.pending.values()], _POLL_S, cf.FIRST_COMPLETED)
        failed, now = [], time.monotonic()
        for rid, p in list(self.pending.items()):
            if not p.future.done() and now < p.deadline:
                continue
            del self.pending[rid]
            try:
                self._start(rid, result(p.future, p.params, 0.0))
            except GrammarError as exc:
                failed.append((rid, str(exc)))
                continue
            p.admit()
        return failed

    def release(self, rid: int) -> None:
        self.grammars.pop(rid, None)
        self.pending.pop(rid, None)

    def accept(self, rid: int, token: int) -> None:
        """Advance `rid`'s grammar by a committed token; a token it refuses is an engine bug, raised so
        that the request fails instead of returning output that breaks its constraint."""
        grammar = self.grammars.get(rid)
        if grammar is not None and not grammar.accept(token):
            raise RuntimeError(f"token {token} breaks request {rid}'s structured_outputs grammar")

    def _blank(self, rows: int) -> torch.Tensor:
        return torch.full((rows, mask_words(self.vocab_size)), ALL_ALLOWED, dtype=torch.int32)

    def decode_mask(self, rids: Sequence[int]) -> torch.Tensor | None:
        """The bitmask of sample rows owned by `rids` (one row each), or None when none is constrained."""
        if not self.grammars:  # the common step: nothing to look up
            return None
        rows = [(i, self.grammars[int(r)]) for i, r in enumerate(rids) if int(r) in self.grammars]
        if not rows:
            return None
        mask = self._blank(len(rids))
        for i, grammar in rows:
            grammar.fill(mask, i)
        return mask

    def verify_mask(
        self, rids: Sequence[int], start: Sequence[int], length: Sequence[int], drafts: Sequence[int]
    ) -> torch.Tensor | None:
        """The bitmask of a verify step's sample rows: sequence k (request rids[k]) owns rows start[k] ..
        + length[k] - 1, row j's draft is drafts[row] (the bonus row has none). None when unconstrained."""
        seqs = [(k, self.grammars[r]) for k, r in enumerate(rids) if r in self.grammars]
        if not seqs:
            return None
        mask = self._blank(len(drafts))
        for k, grammar in seqs:
            a, n = int(start[k]), int(length[k])
            if n > 0:
                grammar.draft_masks(mask, a, [int(t) for t in drafts[a : a + n - 1]])
        return mask

    def valid_drafts(self, rid: int, emitted: Sequence[int], drafts: Sequence[int]) -> int:
        """How many leading drafts the grammar allows after this step's `emitted` tokens (the rest would
        be rejected anyway: they are not verified); len(drafts) for an unconstrained request."""
        grammar = self.grammars.get(rid)
        if grammar is None:
            return len(drafts)
        return max(0, grammar.valid_prefix([*emitted, *drafts]) - len(emitted))
