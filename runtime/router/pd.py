"""The seam for prefill/decode pairs (prompt and completion engines, `dsgraph serve --engine-type`).

The router picks both engines of a pair (select.py: the prefill policy over the prompt engines, the
decode policy over the completion engines) and sends the client's request to the prompt engine, naming
the completion engine in a header. The prompt engine prefills, hands the request over with its KV
(through the store or the transport) to that completion engine, and relays its token stream: the client
reads one stream, as from a normal engine. The prompt engine holds its first byte back until the
completion engine has admitted the request, so a pair that fails before it (either engine down, a failed
handoff) is chosen again, and one that fails later ends in an error event (forward.py). A prompt engine
accepts only completion engines of its own `--pd-peer` list (server/pd_loop.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsgraph.runtime.router.pool import EngineState
    from dsgraph.runtime.router.select import Choice

DECODE_URL_HEADER = "x-dsgraph-decode-url"  # the completion engine that decodes this request
# the cost model's first chunk size (tokens), sent only when the prompt does not fit one step's budget:
# the prompt's length is an estimate (characters / chars_per_token), and a cap at a low estimate would
# split a prompt that fits into two steps
PREFILL_CHUNK_HEADER = "x-dsgraph-prefill-chunk"


def target(choice: Choice) -> EngineState:
    """Where the request is sent: the prompt engine of a pair, else the normal engine."""
    return choice.prefill or choice.engine


def headers(choice: Choice) -> dict[str, str]:
    """The headers that tell a prompt engine its completion engine; none for a normal engine."""
    if choice.prefill is None:
        return {}
    chunks = choice.plan.chunks
    chunk = {PREFILL_CHUNK_HEADER: str(chunks[0])} if len(chunks) > 1 else {}
    return {DECODE_URL_HEADER: choice.engine.url, **chunk}
