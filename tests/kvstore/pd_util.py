"""Helpers of the PD tests: a NORMAL engine's tokens and a PROMPT + COMPLETION pair's, in one process."""

from __future__ import annotations

from typing import Any

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.kvstore.pd_engines import fetch_pages
from dsgraph.runtime.sampling_params import SamplingParams
from dsgraph.tools.generate_cmd import default_model_dir

MAX_LEN = 128


def engine(engine_type: str = "normal", store: Any = None, max_num_seqs: int = 4, **kw: Any) -> Engine:
    config = EngineConfig.from_flat(
        max_model_len=MAX_LEN, max_num_seqs=max_num_seqs, engine_type=engine_type, **kw
    )
    return Engine(default_model_dir(), config, store=store)


def run_all(e: Engine) -> list[Any]:
    events = []
    while e.has_unfinished:
        events.extend(e.step())
    return events


def normal_tokens(e: Engine, prompt: list[int], params: SamplingParams) -> list[int]:
    e.add_request(0, prompt, params)
    out = [ev.token for ev in run_all(e) if ev.token >= 0]
    e.release(0)
    return out


def pair_tokens(p: Engine, c: Engine, prompt: list[int], params: SamplingParams, rid: int = 0) -> list[int]:
    """Prefill on `p`, hand off to `c` (through its store when it has one), decode there."""
    p.add_request(rid, prompt, params)
    first = [ev for ev in run_all(p) if ev.rid == rid]
    p.release(rid)
    assert len(first) == 1, first
    if first[0].finish_reason != "prefilled":  # finished on the prompt engine (eos, max_tokens 1)
        return [first[0].token]
    first[0].handoff.wait_written()
    h = first[0].handoff.handoff
    c.add_prefilled(rid, h, fetch_pages(c, h), params)
    out = [first[0].token] + [ev.token for ev in run_all(c) if ev.rid == rid and ev.token >= 0]
    c.release(rid)
    return out


MODEL = "tiny-pd"


class FaultyTransport:
    """Wraps a real transport; `fault` names the stage that fails next: "publish" (before send), "fetch"
    (the transfer fails), "corrupt" (damaged bytes arrive), "timeout" (the transfer hangs past its
    deadline), "admit" (well-formed bytes whose pages do not fit: refused after the reservation)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.fault = inner, inner.name, None
        self.published: set[str] = set()

    def publish(self, handoff_id: str, payload: bytes) -> Any:
        from dsgraph.runtime.kvstore.transport import TransferError

        if self.fault == "publish":
            raise TransferError("injected: publish failed")
        self.published.add(handoff_id)
        return self.inner.publish(handoff_id, payload)

    def fetch(self, locator: Any, timeout_s: float) -> bytes:
        import time

        from dsgraph.runtime.kvstore import transport as t
        from dsgraph.runtime.kvstore.handoff import Handoff

        if self.fault == "fetch":
            raise t.TransferError("injected: connection reset mid transfer")
        if self.fault == "timeout":
            return t._bounded("injected hang", 0.3, lambda: time.sleep(2) or b"")
        payload = self.inner.fetch(locator, timeout_s)
        if self.fault == "corrupt":
            mid = len(payload) // 2
            return payload[:mid] + bytes([payload[mid] ^ 0xFF]) + payload[mid + 1 :]
        if self.fault == "admit":
            h = Handoff.unpack(t.unpack_payload(payload, "test"))
            short = {r: pages[:-1] for r, pages in h.tails.items()}
            import dataclasses

            return t.pack_payload(dataclasses.replace(h, tails=short).pack())
        return payload

    def discard(self, handoff_id: str) -> None:
        self.published.discard(handoff_id)
        self.inner.discard(handoff_id)

    def close(self) -> None:
        self.inner.close()


def pd_apps(
    backend: str, store: Any = None, **kw: Any
) -> tuple[Any, Any, FaultyTransport, FaultyTransport, Any]:
    """(prompt app factory taking the completion URL, completion app, prompt-side and completion-side
    transports, completion engine)."""
    from dsgraph.runtime.kvstore.transport import make_transport
    from dsgraph.runtime.server.app import create_app
    from dsgraph.runtime.server.pd_app import add_pd_decode, add_pd_prompt
    from dsgraph.runtime.server.pd_loop import CompletionLoop, PromptLoop
    from dsgraph.runtime.server.protocol import recipe_tokenizer

    tok = recipe_tokenizer(default_model_dir())
    ce = engine("completion", store=store, **kw)
    ct = FaultyTransport(make_transport(backend))
    c_app = create_app(ce, MODEL, tok, loop=CompletionLoop(ce, admit_timeout_s=30))
    add_pd_decode(c_app, ct, 5.0)
    pe = engine("prompt", store=store, **kw)
    pt = FaultyTransport(make_transport(backend))

    def prompt_app(url: str, **app_kw: Any) -> Any:
        app = create_app(pe, MODEL, tok, loop=PromptLoop(pe, url, pt, timeout_s=10), **app_kw)
        add_pd_prompt(app)
        return app

    return prompt_app, c_app, pt, ct, ce
