"""A prefilled request moving from a PROMPT engine to a COMPLETION engine. Its full prompt pages travel as
content-addressed store blocks (written through, so a later prompt sharing the prefix finds them); the
rest (the pages past the last full prompt page, the state slot: SWA rings, compressor state) travels
inline in one checksummed handoff object. `model_identity` keys both to the model, numerics, platform
and cache layout, so an engine never imports another model's bytes."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dsgraph.runtime import _native
from dsgraph.runtime.kvstore.layout import CacheLayout
from dsgraph.runtime.kvstore.store import block_key

if TYPE_CHECKING:
    from dsgraph.runtime.engine import Engine
    from dsgraph.runtime.kvstore.store import TieredStore
    from dsgraph.runtime.scheduler import Allocation

FORMAT = "dsgraph-kv-1"
_LEN = struct.Struct("<I")


class HandoffError(RuntimeError):
    """A handoff could not be completed (missing or damaged data, or a layout mismatch)."""


def model_identity(engine: Engine) -> str:
    """Digest of what decides the cache bytes: config.json, the checkpoint files (names and sizes),
    numerics, platform, page size and this format's version."""
    root, c = engine.model_dir, engine.config
    h = hashlib.blake2b(FORMAT.encode(), digest_size=16)
    h.update((root / "config.json").read_bytes())
    for f in sorted(root.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size};".encode())
    h.update(f"{c.numerics}|{c.platform}|{engine.model.geo.page_size}|{engine.model.geo.ring_len}".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Handoff:
    prompt: list[int]
    output: list[int]  # the tokens sampled by the prompt engine (the first token)
    slot: bytes  # the state slot, CacheLayout.slot_bytes
    keys: dict[int, list[str]]  # per ratio: store keys of the full prompt pages, in order
    tails: dict[int, list[bytes]]  # per ratio: the following pages' bytes, in order
    seed: int = 0  # the request's sampling seed (the completion engine samples on with it)
    identity: str = ""  # model_identity of the engine that made it

    def pack(self) -> bytes:
        blobs = [self.slot, *(b for r in sorted(self.tails) for b in self.tails[r])]
        head = {
            "format": FORMAT,
            "prompt": self.prompt,
            "output": self.output,
            "keys": {str(r): k for r, k in self.keys.items()},
            "tails": {str(r): [len(b) for b in t] for r, t in self.tails.items()},
            "slot": len(self.slot),
            "seed": self.seed,
            "identity": self.identity,
        }
        raw = json.dumps(head).encode()
        return _LEN.pack(len(raw)) + raw + b"".join(blobs)

    @classmethod
    def unpack(cls, data: bytes) -> Handoff:
        """The packed handoff; HandoffError when it is truncated, of another format or inconsistent."""
        try:
            (n,) = _LEN.unpack_from(data)
            head = json.loads(data[_LEN.size : _LEN.size + n])
        except (struct.error, ValueError) as exc:
            raise HandoffError(f"handoff header unreadable ({len(data)} bytes): {exc}") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            got = head.get("format") if isinstance(head, dict) else head
            raise HandoffError(f"handoff format {got!r}, expected {FORMAT!r}")
        want = _LEN.size + n + head["slot"] + sum(sum(t) for t in head["tails"].values())
        if len(data) != want:
            raise HandoffError(f"handoff has {len(data)} bytes, its header says {want} (truncated?)")
        at = _LEN.size + n
        slot = data[at : at + head["slot"]]
        at += head["slot"]
        tails: dict[int, list[bytes]] = {}
        for r in sorted(head["tails"], key=int):
            tails[int(r)] = []
            for size in head["tails"][r]:
                tails[int(r)].append(data[at : at + size])
                at += size
        keys = {int(r): k for r, k in head["keys"].items()}
        return cls(head["prompt"], head["output"], slot, keys, tails, head["seed"], head["identity"])


def prompt_block_keys(identity: str, prompt: list[int], ratio: int, page_size: int) -> list[str]:
    """Store keys of the full pages of `prompt` for one ratio (the prefix cache's chain keys)."""
    chain = _native.hash_chain(_tokens(prompt), page_size * ratio)
    return [block_key(identity, ratio, int(k)) for k in chain]


def _tokens(values: list[int]):  # type: ignore[no-untyped-def]
    import numpy as np

    return np.ascontiguousarray(values, dtype=np.int32)


def export_pages(
    engine: Engine, layout: CacheLayout, identity: str, alloc: Allocation, prompt: list[int]
) -> tuple[dict[int, list[tuple[str, bytes]]], dict[int, list[bytes]]]:
    """The allocation's pages as (per ratio) full prompt pages with their keys, and the other pages."""
    caches, page_size = engine.session.caches, engine.model.geo.page_size
    blocks: dict[int, list[tuple[str, bytes]]] = {}
    tails: dict[int, list[bytes]] = {}
    for r, pages in zip(layout.ratios, alloc.pages, strict=True):
        keys = prompt_block_keys(identity, prompt, r, page_size)
        data = [layout.page_bytes(caches, r, p) for p in pages]
        blocks[r] = list(zip(keys, data[: len(keys)], strict=True))
        tails[r] = data[len(keys) :]
    return blocks, tails


def load_blocks(store: TieredStore, handoff: Handoff) -> dict[int, list[bytes]]:
    """Every page of the handoff in order per ratio (store reads: run it off the engine thread)."""
    pages: dict[int, list[bytes]] = {}
    for r, keys in handoff.keys.items():
        got = [store.get(k) for k in keys]
        missing = [i for i, b in enumerate(got) if b is None]
        if missing:
            raise HandoffError(f"store blocks missing for ratio {r} pages {missing} (evicted or corrupt)")
        pages[r] = [b for b in got if b is not None] + handoff.tails.get(r, [])
    return pages


def handoff_path(root: str | Path, handoff_id: str) -> Path:
    return Path(root) / "handoff" / f"{handoff_id}.blk"
