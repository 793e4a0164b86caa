"""The seam for prefill/decode pairs (prompt and completion engines, `dsgraph serve --engine-type`).

The router picks both engines of a pair (select.py: the prefill policy over the prompt engines, the
decode policy over the completion engines) and sends the client's request to the completion engine,
whose stream the client reads, naming the prompt engine in a header. The completion engine asks that
prompt engine to prefill and hand the request over with its KV (through the store or the transport),
then decodes. A pair whose completion engine fails before its first byte is chosen again; after it,
the stream ends in an error event (forward.py). Engines without PD support ignore the headers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsgraph.runtime.router.select import Choice

PREFILL_URL_HEADER = "x-dsgraph-prefill-url"  # the prompt engine that prefills this request
PREFILL_CHUNK_HEADER = "x-dsgraph-prefill-chunk"  # the cost model's first chunk size (tokens)


def headers(choice: Choice) -> dict[str, str]:
    """The headers that tell a completion engine its prompt engine; none for a normal engine."""
    if choice.prefill is None:
        return {}
    return {PREFILL_URL_HEADER: choice.prefill.url, PREFILL_CHUNK_HEADER: str(choice.plan.chunks[0])}
