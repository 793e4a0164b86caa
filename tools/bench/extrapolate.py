"""40-layer figures from the measured 8- and 12-layer models (labelled extrapolated wherever shown).

One added layer costs t = (T12 - T8) / 4 (the 12-layer model adds two Reuse layers of each ratio, which
share weights with existing ones). The released model has 32 more layers than the bench model: 26 of
them Reuse layers, 2 Full r=2 and 3 Reindex, whose indexers cost more at long contexts, so
`T8 + 32 t` is optimistic there; `T8 x 40 / 8` (every layer, embedding and head scaled) is pessimistic.
Decode Reuse layers read a window and top-k entries whatever the context, so t measured at the shortest
context serves every context."""

from __future__ import annotations

from typing import Any

ADDED_LAYERS = 32
WIDER_EXTRA = 4


def _ms(rows: list[dict[str, Any]], key: str) -> dict[Any, float]:
    return {r[key]: r["ms"] for r in rows if "ms" in r}


def _row(base: dict[str, Any], per_layer: float | None, tokens: int) -> dict[str, Any]:
    scaled = base["ms"] * 40 / 8
    row = {"ms_40_scaled": scaled, "tokens_per_s_40_scaled": tokens / (scaled * 1e-3)}
    if per_layer is not None:
        opt = base["ms"] + ADDED_LAYERS * max(per_layer, 0.0)
        row.update(ms_40_layer_cost=opt, tokens_per_s_40_layer_cost=tokens / (opt * 1e-3))
    return row


def extrapolate(out: dict[str, Any]) -> dict[str, Any]:
    wide_dec = _ms(out.get("wider_decode", []), "batch")
    wide_pre = _ms(out.get("wider_prefill", []), "chunk")
    contexts = sorted({r["context"] for r in out["decode"]})
    short = {r["batch"]: r["ms"] for r in out["decode"] if "ms" in r and r["context"] == contexts[0]}
    decode = []
    for r in out["decode"]:
        if "ms" not in r:
            continue
        b = r["batch"]
        t = (wide_dec[b] - short[b]) / WIDER_EXTRA if b in wide_dec and b in short else None
        decode.append({"batch": b, "context": r["context"], **_row(r, t, b)})
    prefill = []
    for r in out["prefill"]:
        if "ms" not in r:
            continue
        c = r["chunk"]
        t = (wide_pre[c] - r["ms"]) / WIDER_EXTRA if c in wide_pre else None
        prefill.append({"chunk": c, **_row(r, t, c)})
    return {"label": "extrapolated from 8 and 12 measured layers", "decode": decode, "prefill": prefill}
