"""Incremental detokenization and stop strings for streaming output.

A byte-level BPE token can hold part of a UTF-8 character (DeepSeek's tokenizer splits most emoji
over several tokens), and a decoder may drop or add a space at the start of a decode. So each push
decodes a short window that starts a few tokens back (the prompt's tail at first), compares it with the
same window without the new token, and returns the difference, but only once the decoded window no longer
ends in U+FFFD, the replacement character an incomplete UTF-8 sequence decodes to.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tokenizers import Tokenizer

__all__ = ["REPLACEMENT_CHAR", "IncrementalDetokenizer", "find_stop", "stop_prefix_len"]

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as decoding context: enough for a decoder's start-of-text handling to settle.
_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    """Turns generated token ids into text pieces as they arrive.

    `push` returns only new, complete text: never half of a multi-byte character. A tail that stays
    incomplete (the model produced invalid UTF-8, or stopped in the middle of a character) comes out,
    with its U+FFFD, from `flush` at the end. `text` is everything returned so far.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int], *, skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        # The window: ids[start:] is decoded; ids[start:done] was returned already (or is prompt).
        self._ids = [int(t) for t in prompt_ids[max(0, len(prompt_ids) - _CONTEXT_TOKENS) :]]
        self._start = 0
        self._done = len(self._ids)
        self.token_ids: list[int] = []
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip_special)

    def _emit(self, allow_incomplete: bool) -> str:
        before = self._decode(self._ids[self._start : self._done])
        after = self._decode(self._ids[self._start :])
        if len(after) <= len(before) or (after.endswith(REPLACEMENT_CHAR) and not allow_incomplete):
            return ""
        # After a complete character, `after` extends `before`; the common prefix also covers a prompt
        # that ended inside a character the output completes.
        new = after[len(os.path.commonprefix([before, after])) :]
        self._ids = self._ids[self._done :]
        self._start, self._done = 0, len(self._ids)
        self.text += new
        return new

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(int(token_id))
        self.token_ids.append(int(token_id))
        return self._emit(allow_incomplete=False)

    def flush(self) -> str:
        """At the end of generation: return whatever is still held back, incomplete characters included."""
        return self._emit(allow_incomplete=True)


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index in `text` where the earliest stop string begins, or None.

    `text` is the whole output so far, so a stop string split over several tokens is found once its
    last piece arrives. `start` is where the text new since the last call begins: only matches that end
    at or after it are searched (earlier ones were found before).
    """
    best: int | None = None
    for stop in stops:
        if not stop:
            raise ValueError("stop strings must be non-empty")
        at = text.find(stop, max(0, start - len(stop) + 1))
        if at >= 0 and (best is None or at < best):
            best = at
    return best


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that begins some stop string without completing it.

    A streaming API holds that tail back: the next tokens may complete the stop string, and the text of
    a stop string is never returned.
    """
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - size :]):
                longest = size
                break
    return longest
