"""One request's grammar state: an XGrammar matcher over the tokens it has committed, and the
allowed-token bitmask rows of a step (`ops/sampling.py`'s layout: bit t % 32 of word t // 32 allows
token t, the layout XGrammar fills).

The matcher always stands at the request's committed tokens. A verify step asks for the masks of every
draft position (`draft_masks`): the matcher walks through the drafts to fill them, then rolls back to
where it stood, so rejected drafts leave no trace; the committed tokens are accepted afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ALL_ALLOWED", "RequestGrammar"]

ALL_ALLOWED = -1  # an i32 word with every bit set


class RequestGrammar:
    """A matcher of one compiled grammar (XGrammar keeps every accepted token for rollback)."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xg

        self.matcher = xg.GrammarMatcher(compiled)

    @property
    def finished(self) -> bool:
        """The grammar has accepted its stop token: nothing may follow."""
        return bool(self.matcher.is_terminated())

    def fill(self, mask: torch.Tensor, row: int) -> None:
        """Row `row` of the i32 bitmask [rows, words] (on the host) := the tokens allowed next."""
        self.matcher.fill_next_token_bitmask(mask, row)

    def accept(self, token: int) -> bool:
        """Advance by a committed token; False (and no move) when the grammar does not allow it."""
        return bool(self.matcher.accept_token(int(token)))

    def draft_masks(self, mask: torch.Tensor, first_row: int, drafts: Sequence[int]) -> int:
        """Fill rows first_row .. first_row + len(drafts) of `mask`: row j holds the tokens allowed after
        drafts[:j]. A draft the grammar refuses is rejected by the verification (its mask excludes it),
        so the rows after it stay all-allowed (they emit nothing). Returns the number of leading drafts
        the grammar accepts; the matcher ends where it began."""
        walked = 0
        self.fill(mask, first_row)
        for j, token in enumerate(drafts):
            if not self.matcher.accept_token(int(token)):
                break
            walked += 1
            if self.finished:  # a stop token: the request ends there
                break
            self.fill(mask, first_row + j + 1)
        if walked:
            self.matcher.rollback(walked)
        return walked

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the grammar accepts from here (the matcher ends where it began)."""
        walked = 0
        for token in tokens:
            if self.finished or not self.matcher.accept_token(int(token)):
                break
            walked += 1
        if walked:
            self.matcher.rollback(walked)
        return walked
