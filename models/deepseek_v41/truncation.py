"""Prefill truncation (decoder-side SWA bounded replay, spec model-v41 5.6 item 2) in the step graph.

The decoder layers (from the layer that sources the decoder's long-range KV, `decoder_start`, to the
last) own nothing that a later token reads except their sliding-window keys, so for a prompt they only
need to run on its last KEEP tokens. The encoder layers, and the KV-source part of the boundary layer
(its compressor and index keys: the decoder's global cache), still run on every row.

Two graph variants realise the same numbers on the kept rows:

- `mask`: every layer runs on every row; a decoder layer reads no SWA key below the request's kept
  suffix (`seq_decoder_window_start` replaces `seq_window_start`), so rows before it see no SWA key.
- `compact`: at the boundary its compressed entries and index keys are written from every row; then the
  residual streams and the mHC pre-mix are gathered to the kept rows (`kept_rows`) and the decoder, the
  final norm and the head run on those rows only (`kept_positions`, `kept_seq_ids`, and per sequence
  `seq_decoder_start`, the first kept position of its chunk; `sample_rows` index the kept rows). A
  chunk wholly before its suffix puts no row in the decoder (DeepInfer keeps its last row as a
  placeholder sampling row; here such a chunk samples nothing).

The host side (which rows are kept, the start-up rule on KEEP) is `runtime/prefill_truncation.py`.
"""

from __future__ import annotations

from dsgraph.graph.types import TensorType
from dsgraph.models.deepseek_v41.config import TextConfig
from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.layers_plan import LayerPlan
from dsgraph.ops import op

__all__ = ["MODES", "check_truncatable", "decoder_start", "enter_decoder", "truncation_types"]

MODES = ("off", "mask", "compact")


def decoder_start(text: TextConfig) -> int:
    """The first decoder layer: the last KV source, whose compressed cache every later layer reads."""
    return max(text.kv_source_layer_ids)


def check_truncatable(text: TextConfig, dspark_layers: tuple[int, ...] = ()) -> None:
    """ValueError naming the field when the config has no decoder to truncate or keeps state of an
    encoder layer in a decoder one (Engram tables are read per row: they must sit in the encoder)."""
    if not text.kv_source_layer_ids:
        raise ValueError("prefill_truncation: the config has no kv_source_layer_ids, so no decoder layers")
    first = decoder_start(text)
    late = [i for i in text.engram_layer_ids if i >= first]
    if late:
        raise ValueError(
            f"prefill_truncation: engram_layer_ids {list(text.engram_layer_ids)} has layers {late} at or "
            f"after the first decoder layer {first}; Engram layers must be encoder layers"
        )
    early = [i for i in dspark_layers if i < first]
    if early:
        raise ValueError(
            f"prefill_truncation: dspark_target_layer_ids {list(dspark_layers)} has layers {early} before "
            f"the first decoder layer {first}; with truncation every DSpark target must be a decoder layer"
        )


def truncation_types(mode: str) -> dict[str, TensorType]:
    """The step inputs a truncated step adds (`step_io.step_types` has the others)."""
    if mode not in MODES[1:]:
        raise ValueError(f"prefill_truncation: {mode!r} has no truncated step, expected 'mask' or 'compact'")
    i32 = "i32"
    types = {"seq_decoder_window_start": TensorType(("seqs",), i32)}
    if mode == "compact":
        types.update(
            kept_rows=TensorType(("kept",), i32),
            kept_positions=TensorType(("kept",), i32),
            kept_seq_ids=TensorType(("kept",), i32),
            seq_decoder_start=TensorType(("seqs",), i32),
        )
    return types


def enter_decoder(
    f: Forward, mode: str, plan: LayerPlan, x: Tracer, a: Tracer | None
) -> tuple[Tracer, Tracer | None]:
    """Switch `f` to the decoder's view before the boundary layer `plan` runs; returns its (x, a)."""
    from dsgraph.models.deepseek_v41.attention_block import _compress
    from dsgraph.models.deepseek_v41.backbone import _collapse

    s = f.step
    if mode == "mask":
        f.step = {**s, "seq_window_start": s["seq_decoder_window_start"]}
        return x, a
    # The decoder's global cache comes from every row: attn_norm(collapse(x)) of the boundary, as in
    # its own block; the block then runs on the kept rows and skips this write.
    u = f.norm(_collapse(f, x, a), f"layers.{plan.index}.attn_norm.weight")
    _compress(f, plan, u)
    f.compressed.add(plan.index)
    rows = s["kept_rows"]
    f.step = {
        **s,
        "positions": s["kept_positions"],
        "seq_ids": s["kept_seq_ids"],
        "seq_start": s["seq_decoder_start"],
        "seq_window_start": s["seq_decoder_window_start"],
        "is_replay": op.gather_rows(s["is_replay"], rows),
    }
    return op.gather_rows(x, rows), None if a is None else op.gather_rows(a, rows)
