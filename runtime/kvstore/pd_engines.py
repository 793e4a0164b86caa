"""The engine side of prefill/decode disaggregation. A PROMPT engine's request ends with reason
"prefilled" after its first sampled token: `export_handoff` copies its caches out (full prompt pages
written through to the store when there is one, the rest inline) and frees them. A COMPLETION engine
admits such a request with `admit_handoff`: it reserves a slot and pages (`add_prefilled`), writes the
handed-off bytes into them and replays the first token through the detokenizer, so the request then
decodes exactly as it would have on a NORMAL engine (same caches, same seed, same positions)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsgraph.runtime.kvstore.handoff import Handoff, HandoffError, export_pages, load_blocks, model_identity
from dsgraph.runtime.kvstore.layout import CacheLayout
from dsgraph.runtime.sampling_params import RequestError, SamplingParams

if TYPE_CHECKING:
    from dsgraph.runtime.engine import Engine
    from dsgraph.runtime.kvstore.store import TieredStore


@dataclass
class PDState:
    """What an engine of type prompt or completion keeps for handoffs: its cache layout, the model
    identity that keys its blocks, and the store shared with the other engines (None: every page travels
    inline in the handoff)."""

    layout: CacheLayout
    identity: str
    store: TieredStore | None = None
    exported: int = 0  # handoffs made (prompt engine)
    admitted: int = 0  # handoffs admitted (completion engine)


@dataclass(frozen=True)
class Exported:
    """A PROMPT engine's handoff; `written` (with a store) completes once its blocks are in the store:
    wait for it before a peer may read them."""

    handoff: Handoff
    written: Future[None] | None = None

    def wait_written(self, timeout_s: float | None = None) -> None:
        if self.written is not None:
            self.written.result(timeout_s)


def pd_state(engine: Engine, store: TieredStore | None) -> PDState:
    from dsgraph.models.interface import ratios

    layout = CacheLayout(engine.model.cache_types(), ratios(engine.model.plans))
    return PDState(layout, model_identity(engine), store)


def export_handoff(engine: Engine, rid: int) -> Exported:
    """The prefilled request `rid` as a Handoff (its scheduler hand-off is released either way). With a
    store the full prompt pages are written through on the store's threads and travel as keys."""
    pd = _state(engine)
    live = engine.live[rid]
    try:
        alloc = engine.scheduler.handoff(rid)
        blocks, tails = export_pages(engine, pd.layout, pd.identity, alloc, live.prompt)
        slot = pd.layout.slot_bytes(engine.session.caches, alloc.slot)
    finally:
        engine.scheduler.release_handoff(rid)
    written = None
    if pd.store is not None:
        written = pd.store.put_async(kv for r in blocks for kv in blocks[r])
        keys = {r: [k for k, _ in blocks[r]] for r in blocks}
    else:  # no store: the full pages travel inline, ahead of the partial ones
        keys = {r: [] for r in blocks}
        tails = {r: [b for _, b in blocks[r]] + tails[r] for r in blocks}
    pd.exported += 1
    handoff = Handoff(list(live.prompt), list(live.tokens), slot, keys, tails, live.seed, pd.identity)
    return Exported(handoff, written)


def fetch_pages(engine: Engine, handoff: Handoff) -> dict[int, list[bytes]]:
    """Every page of `handoff` per ratio, reading the keyed ones from the store (blocking reads: call it
    off the engine thread). HandoffError when a block is missing or there is no store to read it from."""
    pd = _state(engine)
    if any(handoff.keys.values()) and pd.store is None:
        raise HandoffError("the handoff names store blocks but this engine has no KV store (--kv-store-path)")
    if pd.store is None:
        return {r: list(t) for r, t in handoff.tails.items()}
    return load_blocks(pd.store, handoff)


def check_admissible(engine: Engine, handoff: Handoff, params: SamplingParams) -> None:
    """RequestError / HandoffError for a handoff this engine can never admit (checked before anything is
    reserved): bad params, unsupported features, tokens past max_model_len."""
    params.validate(engine.cfg.text.vocab_size)
    if handoff.identity != _state(engine).identity:
        raise HandoffError(
            f"the handoff comes from another model or cache layout (identity {handoff.identity[:12]}..., "
            f"this engine's {_state(engine).identity[:12]}...)"
        )
    if params.structured_outputs is not None:
        raise RequestError("structured_outputs", "set", "absent with prefill/decode disaggregation")
    if not handoff.output:
        raise HandoffError("the handoff carries no sampled token")
    total = len(handoff.prompt) + len(handoff.output)
    if total >= engine.model.geo.max_model_len:
        raise RequestError(
            "prompt", f"{total} tokens", f"shorter than max_model_len {engine.model.geo.max_model_len}"
        )


def admit_handoff(
    engine: Engine, rid: int, handoff: Handoff, pages: dict[int, list[bytes]], params: SamplingParams
) -> None:
    """Admit the handed-off request as `rid`: reserve its slot and pages, write the caches, replay the
    sampled token(s). Raises (and holds nothing) when there is no room (RuntimeError) or the bytes do not
    fit this engine's layout (HandoffError / ValueError naming the page or slot)."""
    from dsgraph.runtime.detokenizer import IncrementalDetokenizer
    from dsgraph.runtime.engine_records import Live

    pd = _state(engine)
    check_admissible(engine, handoff, params)
    p = params
    alloc = engine.scheduler.add_prefilled(
        rid,
        handoff.prompt,
        handoff.output,
        max_tokens=p.max_tokens,
        eos_id=-1 if p.ignore_eos else engine.cfg.eos_token_id,
        ignore_eos=p.ignore_eos,
        stop_token_ids=p.stop_token_ids,
    )
    try:
        _write(engine, pd, alloc, pages, handoff.slot)
    except BaseException:
        engine.scheduler.abort(rid)  # frees the reservation; its abort event has no listener
        raise
    detok = IncrementalDetokenizer(
        engine.tokenizer, handoff.prompt, skip_special_tokens=p.skip_special_tokens
    )
    live = Live(p, handoff.seed, list(handoff.prompt), detok)
    for token in handoff.output:  # the prompt engine emitted these: same detokenizer and stop state
        live.tokens.append(token)
        engine.push_text(rid, live, token, False)
    live.num_cached_tokens = 0
    engine.live[rid] = live
    pd.admitted += 1


def _write(engine: Engine, pd: PDState, alloc, pages: dict[int, list[bytes]], slot: bytes) -> None:  # type: ignore[no-untyped-def]
    caches = engine.session.caches
    for r, held in zip(pd.layout.ratios, alloc.pages, strict=True):
        got = pages.get(r, [])
        if len(got) != len(held):
            raise HandoffError(
                f"ratio {r}: the handoff has {len(got)} pages, this engine reserved {len(held)}"
            )
        for page, data in zip(held, got, strict=True):
            pd.layout.write_page(caches, r, page, data)
    pd.layout.write_slot(caches, alloc.slot, slot)


def _state(engine: Engine) -> PDState:
    if engine.pd is None:
        raise HandoffError(f"engine_type {engine.config.engine_type!r} does not hand requests off")
    return engine.pd


def export_running(engine: Engine, rid: int) -> Exported:
    """A decoding request of a COMPLETION engine as a Handoff (every page inline), for another completion
    engine to continue it (a drain): its caches hold every token but the newest, as after a prefill. The
    caller then aborts it here. HandoffError when it is not between two decode steps."""
    pd = _state(engine)
    live = engine.live[rid]
    alloc = engine.scheduler.native.allocation(rid)
    cached = alloc.num_cached
    if not live.tokens or cached != len(live.prompt) + len(live.tokens) - 1:
        raise HandoffError(f"request {rid} is not decoding ({cached} of its tokens are cached)")
    caches, page_size = engine.session.caches, engine.model.geo.page_size
    tails = {}
    for r, pages in zip(pd.layout.ratios, alloc.pages, strict=True):
        need = -(-(cached // r) // page_size)  # the scheduler's pages_needed: whole entries, in pages
        tails[r] = [pd.layout.page_bytes(caches, r, p) for p in pages[:need]]
    slot = pd.layout.slot_bytes(caches, alloc.slot)
    keys: dict[int, list[str]] = {r: [] for r in tails}
    handoff = Handoff(list(live.prompt), list(live.tokens), slot, keys, tails, live.seed, pd.identity)
    return Exported(handoff)
